"""A local swarm whose workers generate with vLLM (`inference.backend = "vllm"`).
Skipped where vLLM is not installed (`make vllm`)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess

import pytest

from tests.integration.conftest import read_metrics, swarm_cmd

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (`make vllm` installs it; CI does)",
)


@pytest.mark.slow  # 77 s; in the default suite: an honest vLLM file accepted (tests/unit/test_vllm_backend.py)
def test_vllm_workers_train_and_their_files_pass_validation(tiny_model, tmp_path):
    """Two vLLM workers feed 8 steps: every file is judged and accepted, and each worker
    swaps the new policy versions into its running engine (one engine start each)."""
    steps = 8
    res = subprocess.run(
        swarm_cmd(
            tmp_path, tiny_model, f"trainer.steps={steps}", "inference.backend=vllm",
            "inference.kv_cache_gb=1", "launcher.eval_problems=0",
        ),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    run = tmp_path / "runs" / "tiny"
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run)] == list(range(1, steps + 1))
    verdicts = [json.loads(x) for x in (run / "verdicts.jsonl").read_text().splitlines()]
    assert verdicts and all(v["accepted"] for v in verdicts), [
        (v["check"], v["reason"]) for v in verdicts if not v["accepted"]
    ]
    for i in (0, 1):
        log = (run / "logs" / f"worker-{i}.log").read_text()
        assert "vllm backend" in log
        assert log.count("vLLM engine on") == 1  # started once, then swapped in place
        versions = [int(v) for v in re.findall(r"loaded policy version (\d+)", log)]
        assert len(versions) >= 3 and versions == sorted(versions)
