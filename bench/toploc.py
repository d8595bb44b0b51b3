"""TOPLOC costs on one model and machine: what proofs add to generation, and how much
faster validation is than generation.

    .venv/bin/python bench/toploc.py [--model PATH|smollm2] [--samples N]
        [--max-new-tokens N] [--reps R] [--threads T] [--peer]

For each setting (default: the run's tiny model with the run's 12-token limit, then
SmolLM2-135M-Instruct with 128 tokens; the tiny model ends on EOS within a dozen tokens
whatever the limit), in one process, repetitions interleaved:
- generation tokens/s without proofs and with them (hook + proof building); the
  overhead is 1 - with/without (goal: at most 2%);
- validation tokens/s: the validator's model-side work on the same samples (one
  prefill, TOPLOC checks, sampling and log-prob checks) and the whole judgement of a
  rollout file (schema, assignment, re-scoring too); the ratio to generation tokens/s
  (goal: at least 20x);
- proof bytes per generated token; proof build and verify time per chunk.
With --peer, bench/toploc_peer.py runs the published `toploc` package on the same
chunk shapes and its build/verify times per chunk go beside ours.

Prints one JSON object; also written to bench/results/toploc.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rollout_files import Maker, make_judge, small_run  # noqa: E402
from swarmrl.inference.hf import HFBackend  # noqa: E402
from swarmrl.protocol.rollouts import read_rollouts  # noqa: E402
from swarmrl.toploc.proof import CHUNK, build_proofs_many, check_proofs_many  # noqa: E402
from swarmrl.validator.checks import check_with_model  # noqa: E402

TINY = ROOT / "models" / "tiny-reverse_text"


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(model: str, samples: int, max_new: int, reps: int, tmp: Path) -> dict:
    group = 8
    cfg = small_run(
        tmp,
        Path(model) if model != "smollm2" else model,
        f"worker.group_size={group}",
        f"worker.groups_per_file={max(1, samples // group)}",
        f"sampling.max_new_tokens={max_new}",
        "task.min_len=3",
        "task.max_len=6",
    )
    maker = Maker(cfg, tmp, name=f"bench-{max_new}")
    judge = make_judge(cfg, tmp / f"judge-{max_new}")
    key, data = maker.file()  # warm-up, and one real file for the whole judgement
    rows = read_rollouts(data)
    prompts = [r["prompt_tokens"] for r in rows]
    seeds = [r["seed"] for r in rows]
    gen_tokens = sum(len(r["completion_tokens"]) for r in rows)
    s = cfg.sampling
    be: HFBackend = maker.backend

    def gen(proofs: bool):
        return lambda: be.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p, proofs)

    # interleave with/without so drift hits both alike
    with_p, without_p = [], []
    for _ in range(reps):
        without_p.append(_median_time(gen(False), 1))
        with_p.append(_median_time(gen(True), 1))
    t_without, t_with = statistics.median(without_p), statistics.median(with_p)
    judge.ensure_policy(0)
    t_model_side = _median_time(lambda: check_with_model(judge.ctx, judge.backend, rows), reps)

    def whole():
        v = judge.judge(key, data)
        assert v is not None and v.accepted, (v.check, v.reason)

    t_judge = _median_time(whole, reps)
    states = judge.backend.prefill(prompts, [r["completion_tokens"] for r in rows])
    hidden = [h for h, _ in states]
    n_chunks = sum((len(h) + CHUNK - 1) // CHUNK for h in hidden)
    t_build = _median_time(lambda: build_proofs_many(hidden), reps)
    proofs = build_proofs_many(hidden)
    t_check = _median_time(lambda: check_proofs_many(proofs, hidden), reps)
    gen_tps = gen_tokens / t_without
    return {
        "model": str(model),
        "hidden_size": int(hidden[0].shape[-1]),
        "samples": len(rows),
        "max_new_tokens": max_new,
        "generated_tokens": gen_tokens,
        "generation_tokens_per_s": round(gen_tps, 1),
        "generation_with_proofs_tokens_per_s": round(gen_tokens / t_with, 1),
        "proof_overhead": round(1 - t_without / t_with, 4),
        "validation_model_side_tokens_per_s": round(gen_tokens / t_model_side, 1),
        "validation_whole_file_tokens_per_s": round(gen_tokens / t_judge, 1),
        "validation_speedup_model_side": round(t_without / t_model_side, 2),
        "validation_speedup_whole_file": round(t_without / t_judge, 2),
        "proof_bytes_per_token": round(sum(len(p) for p in proofs) / gen_tokens, 2),
        "chunks": n_chunks,
        "build_ms_per_chunk": round(1000 * t_build / n_chunks, 3),
        "verify_ms_per_chunk": round(1000 * t_check / n_chunks, 3),
        "raw_seconds": {
            "generate": t_without,
            "generate_with_proofs": t_with,
            "validate_model_side": t_model_side,
            "validate_whole_file": t_judge,
        },
    }


def peer(quick: bool) -> dict | None:
    script = ROOT / "bench" / "toploc_peer.py"
    if not script.exists():
        return None
    res = subprocess.run(
        [sys.executable, str(script), "--threads", "1"] + (["--quick"] if quick else []),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if res.returncode != 0:
        return {"error": res.stderr[-2000:]}
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="model path or smollm2 (repeatable)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, action="append")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peer", action="store_true", help="also run bench/toploc_peer.py")
    ap.add_argument("--quick", action="store_true", help="fewer settings (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        settings = [(m, n) for m in args.model for n in (args.max_new_tokens or [128])]
    elif args.quick:
        settings = [(str(TINY), 12)]
    else:
        settings = [(str(TINY), 12), ("smollm2", 128)]
    results = []
    with tempfile.TemporaryDirectory() as d:
        for model, max_new in settings:
            print(f"bench/toploc: {model}, {max_new} new tokens ...", file=sys.stderr)
            results.append(measure(model, args.samples, max_new, args.reps, Path(d)))
            print(json.dumps(results[-1]), file=sys.stderr)
    out = {"threads": args.threads, "settings": results}
    if args.peer:
        out["peer"] = peer(args.quick)
    text = json.dumps(out, indent=2)
    print(text)
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "toploc.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
