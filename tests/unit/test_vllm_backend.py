"""The vLLM backend: its files pass the validator, its cheats do not, and it samples
the same tokens as the HF backend. Skipped where vLLM is not installed (`make vllm`).

vLLM runs in a process of its own (tests/unit/vllm_files.py), as in a worker; the
validator and the HF backend run here."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.rollout_files import ISSUED, issued, make_judge, small_run
from swarmrl.inference.hf import HFBackend
from swarmrl.protocol.rollouts import read_rollouts
from swarmrl.toploc.sampling import check_sampling

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (`make vllm` installs it; CI does)",
)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def made(random_model_dir, tmp_path_factory):
    """Everything the vLLM process produced, and the run it produced it for."""
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    tmp = tmp_path_factory.mktemp("vllm")
    other = tmp / "other_model"
    tok = build_char_tokenizer()
    build_tiny_model(tok, hidden=64, layers=2, seed=2).save_pretrained(other)
    tok.save_pretrained(other)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.vllm_files", str(tmp), str(random_model_dir), str(other)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp / "vllm.json").read_text())
    cfg = small_run(tmp, random_model_dir)
    return cfg, tmp, report


def _file(report, name):
    key, data, assignment = report[name]
    ISSUED[key] = assignment  # issued in the process that made the file
    return key, base64.b64decode(data)


def test_an_honest_vllm_file_is_accepted(made):
    cfg, tmp, report = made
    key, data = _file(report, "honest")
    v = make_judge(cfg, tmp).judge(key, data, issued=issued(key))
    assert v.accepted, (v.check, v.reason)
    rows = read_rollouts(data)
    assert len(rows) == cfg.worker.groups_per_file * cfg.worker.group_size
    assert max(len(r["completion_tokens"]) for r in rows) > 32  # two proof chunks


def test_one_token_changed_is_rejected(made):
    """Generated with vLLM, one token changed, text and reward scored from the change."""
    cfg, tmp, report = made
    key, data = _file(report, "one_token")
    v = make_judge(cfg, tmp).judge(key, data, issued=issued(key))
    assert not v.accepted
    assert v.check in ("proof", "sampling"), (v.check, v.reason)
    assert len(v.samples) == 1


def test_a_file_from_another_model_fails_the_proofs(made):
    cfg, tmp, report = made
    key, data = _file(report, "other_model")
    v = make_judge(cfg, tmp).judge(key, data, issued=issued(key))
    assert not v.accepted
    assert v.check == "proof", (v.check, v.reason)


@pytest.mark.parametrize("sampler", ["1.0,1.0", "0.7,0.9"])
def test_vllm_and_hf_sample_the_same_tokens(made, random_model_dir, sampler):
    """Float32 on CPU: the same seeded Gumbel-max choice on the two engines' logits.
    Each completion is also checked against the validator's prefill logits."""
    _, _, report = made
    t, p = map(float, sampler.split(","))
    hf = HFBackend()
    hf.load(random_model_dir)
    before = report["before"]
    mine = hf.generate(before["prompts"], before["seeds"], 40, t, p)
    theirs = before[sampler]
    same = sum(c.tokens == v[0] for c, v in zip(mine, theirs, strict=True))
    assert same == len(mine), f"{len(mine) - same} of {len(mine)} completions differ"
    for c, (_, logprobs, finished) in zip(mine, theirs, strict=True):
        assert c.finished == finished
        assert max(abs(a - b) for a, b in zip(c.logprobs, logprobs, strict=True)) < 1e-4
    prefilled = hf.prefill(before["prompts"], [v[0] for v in theirs])
    for (_, logits), (tokens, _, _), seed in zip(prefilled, theirs, before["seeds"], strict=True):
        assert check_sampling(logits, torch.tensor(tokens), seed, t, p).failures == 0
    assert len({len(v[0]) for v in theirs}) > 1  # some stop on EOS, some at the limit


def test_weights_swap_in_place_and_back(made):
    """Another model's weights swapped into the running engine change its output;
    swapping the policy back gives the first completions again, token for token."""
    _, _, report = made
    assert report["other"] != report["before"]  # the swap took effect
    for sampler in ("1.0,1.0", "0.7,0.9"):
        assert report["other"][sampler] != report["before"][sampler]
    assert report["after"] == report["before"]  # and swapping back restores the policy
    assert all(0 < s < 30 for s in report["swap_s"])


def test_a_vllm_trajectory_file_is_accepted(made, random_model_dir):
    """Trajectories made on vLLM (turns cut at the environment's call rule, the
    states of the environment's positions taken by prefill) pass every check."""
    from bench.trajectory_envs import Echo
    from swarmrl.envs import environment as environment_module
    from swarmrl.protocol.rollouts import spans
    from tests.unit.vllm_files import TRAJECTORY_RUN

    _, tmp, report = made
    cfg = small_run(tmp, random_model_dir, *TRAJECTORY_RUN)
    key_env = environment_module.built_key(cfg)
    environment_module._BUILT[key_env] = Echo()
    try:
        key, data = _file(report, "trajectory_file")
        rows = read_rollouts(data)
        assert any(len(spans(r["completion_mask"])) >= 3 for r in rows)  # Echo answered
        v = make_judge(cfg, tmp).judge(key, data, issued=issued(key))
        assert v.accepted, (v.check, v.reason)
    finally:
        environment_module._BUILT.pop(key_env)


@pytest.mark.parametrize("name", ["echo", "nag"])
def test_vllm_and_hf_make_the_same_trajectories(made, random_model_dir, name):
    """The same seeds give the same trajectories on both engines: a turn cut at a call
    (echo) and turns that end on end of sequence, answered by a user turn (nag)."""
    from bench.trajectory_envs import Echo, Nag
    from swarmrl.inference.trajectory import generate_trajectories
    from swarmrl.models.loading import load_tokenizer

    _, _, report = made
    prompts, seeds = report["trajectory_prompts"]
    hf = HFBackend()
    hf.load(random_model_dir)
    env = Echo() if name == "echo" else Nag()
    mine = generate_trajectories(
        hf, load_tokenizer(str(random_model_dir)), env, prompts, seeds, 40, 1.0, 1.0
    )
    theirs = report[name]
    assert [t.tokens for t in mine] == [v[0] for v in theirs]
    assert [t.mask for t in mine] == [v[2] for v in theirs]
    assert [t.finished for t in mine] == [v[3] for v in theirs]
    assert any(0 in v[2] for v in theirs)  # the environment answered
    for t, v in zip(mine, theirs, strict=True):
        assert max(abs(a - b) for a, b in zip(t.logprobs, v[1], strict=True)) < 1e-4
