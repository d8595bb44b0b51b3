"""Multi-turn trajectory generation on the two engines: HF (swarmrl's sampling loop on
transformers) against vLLM (`generate_trajectories_vllm`), with proofs and without.

    .venv/bin/python bench/vllm_trajectories.py [--threads T] [--reps R] [--batch B]

The run's tiny model, the task's first B prompts, the same seeds and sampler
(temperature 1, top-p 1, 120 new tokens), and two test environments
(bench/trajectory_envs.py): `echo` cuts a span at a call rule after three
characters and answers a short text (vLLM samples past the cut), `nag` answers
each end of turn with a user turn (many environment tokens, whose states vLLM
takes with one more request each). Each engine runs in a process of its own, one
after the other, with the same thread count; the two must make the same
trajectories (a digest of every trajectory's tokens and mask is compared).

Prints one JSON object: per environment, each engine's tokens per second (median
of R timed calls after a warm-up) with and without proofs, vLLM / HF with proofs,
and each engine's cost of the proofs (time with / time without). Also written to
bench/results/vllm_trajectories.json. Prints "skipped" where vLLM is not installed
(`make vllm`). No goal is set: this measures what the proofs of environment
positions cost on vLLM (docs/multi-turn.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "models/tiny-reverse_text"
MAX_NEW = 120


def child(engine: str, threads: int, reps: int, batch: int) -> dict:
    """Runs in its own process: one engine's figures."""
    import torch

    from bench.trajectory_envs import Echo, Nag
    from swarmrl.config import load_config
    from swarmrl.inference.trajectory import generate_trajectories
    from swarmrl.models.loading import load_tokenizer
    from swarmrl.models.prompting import encode_prompt, prompt_text
    from swarmrl.tasks.sources.task_source import TaskSource

    torch.set_num_threads(threads)
    if engine == "hf":
        from swarmrl.inference.hf import HFBackend

        backend = HFBackend(max_batch=batch)
    else:
        from swarmrl.inference.vllm import VLLMBackend

        backend = VLLMBackend(max_batch=batch, threads=threads, kv_cache_gb=2)
    backend.load(ROOT / MODEL)
    tok = load_tokenizer(str(ROOT / MODEL))
    source = TaskSource(load_config(str(ROOT / "configs" / "tiny.toml"), []).task, 0)
    prompts = [
        encode_prompt(tok, prompt_text(source.get("train", i, 0).prompt, 0)) for i in range(batch)
    ]
    seeds = list(range(2000, 2000 + batch))
    out: dict = {"engine": engine}
    for name, env in (("echo", Echo()), ("nag", Nag())):
        generate_trajectories(backend, tok, env, prompts[:8], seeds[:8], MAX_NEW, 1.0, 1.0)
        for proofs in (False, True):
            times = []
            for _ in range(reps):
                if engine == "vllm":
                    backend.llm.reset_prefix_cache()  # each timed call starts cold
                t0 = time.perf_counter()
                got = generate_trajectories(
                    backend, tok, env, prompts, seeds, MAX_NEW, 1.0, 1.0, proofs
                )
                times.append(time.perf_counter() - t0)
            made = json.dumps([[t.tokens, t.mask] for t in got])
            out[f"{name}_{'proofs' if proofs else 'noproofs'}"] = {
                "tokens": sum(len(t.tokens) for t in got),
                "environment_tokens": sum(len(t.mask) - sum(t.mask) for t in got),
                "seconds": statistics.median(times),
                "digest": hashlib.sha256(made.encode()).hexdigest(),
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--child", choices=["hf", "vllm"])
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.reps, a.batch)))
        return
    from swarmrl.inference.vllm import vllm_available

    if not vllm_available():
        print(json.dumps({"skipped": "vLLM is not installed (make vllm)"}))
        return
    runs = {}
    for engine in ("hf", "vllm"):
        cmd = [sys.executable, __file__, "--child", engine, "--threads", str(a.threads),
               "--reps", str(a.reps), "--batch", str(a.batch)]  # fmt: skip
        res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        runs[engine] = json.loads(res.stdout.strip().splitlines()[-1])
    hf, vl = runs["hf"], runs["vllm"]
    report: dict = {"threads": a.threads, "batch": a.batch, "max_new_tokens": MAX_NEW}
    for name in ("echo", "nag"):
        same = all(
            hf[f"{name}_{k}"]["digest"] == vl[f"{name}_{k}"]["digest"]
            for k in ("proofs", "noproofs")
        )
        row = {"same_trajectories": same,
               "tokens": hf[f"{name}_proofs"]["tokens"],
               "environment_tokens": hf[f"{name}_proofs"]["environment_tokens"]}  # fmt: skip
        for engine, r in runs.items():
            for k in ("proofs", "noproofs"):
                row[f"{engine}_{k}_tok_per_s"] = round(
                    r[f"{name}_{k}"]["tokens"] / r[f"{name}_{k}"]["seconds"], 1
                )
            row[f"{engine}_proof_cost"] = round(
                r[f"{name}_proofs"]["seconds"] / r[f"{name}_noproofs"]["seconds"], 2
            )
        row["vllm_over_hf_with_proofs"] = round(
            hf[f"{name}_proofs"]["seconds"] / vl[f"{name}_proofs"]["seconds"], 2
        )
        report[name] = row
    out = ROOT / "bench" / "results" / "vllm_trajectories.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
