"""Generation speed of the two backends: HF (swarmrl's sampling loop on transformers)
against vLLM (its engine with swarmrl's seeded sampler and TOPLOC hook).

    .venv/bin/python bench/inference.py [--models tiny,smollm2] [--threads T] [--reps R]

For each model (the run's tiny model with its 12-token limit; SmolLM2-135M-Instruct,
converted once from the package's GGUF to a safetensors directory, with 64 tokens),
the same prompts (the task's first problems, through the run's prompt template), the
same seeds and sampler (temperature 1, top-p 1), at batch 64 and 256, with proofs and
without: generated tokens per second (median of R timed calls after one warm-up),
and the time to swap a new version of the weights into the loaded engine. Each
backend runs in a process of its own (vLLM's CPU worker takes over the process's
thread settings), one after the other, with the same thread count. The two must
generate the same tokens (a digest of every completion is compared): the ratio is
then of equal work.

Prints one JSON object with the ratios vLLM / HF; also written to
bench/results/inference.json. Goal: vLLM with proofs at least 3x HF's tokens/s on CPU.
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

MODELS = {
    "tiny": {"path": "models/tiny-reverse_text", "config": "configs/tiny.toml", "max_new": 12},
    "smollm2": {"path": "smollm2", "config": "configs/smollm2-addition.toml", "max_new": 64},
}
BATCHES = (64, 256)


def hf_directory(path: str, cache: Path) -> Path:
    """A safetensors directory of the model (vLLM here loads HF directories)."""
    if path != "smollm2":
        return ROOT / path
    out = cache / "smollm2-hf"
    if not (out / "config.json").exists():
        from swarmrl.models.loading import load_model, load_tokenizer

        load_model(path).save_pretrained(out)
        load_tokenizer(path).save_pretrained(out)
    return out


def prompts_for(spec: dict, n: int) -> list[list[int]]:
    from swarmrl.config import load_config
    from swarmrl.models.loading import load_tokenizer
    from swarmrl.models.prompting import encode_prompt, prompt_text
    from swarmrl.tasks.sources.task_source import TaskSource

    cfg = load_config(str(ROOT / spec["config"]), [])
    source = TaskSource(cfg.task, cfg.seed)
    tok = load_tokenizer(spec["dir"])
    out = []
    for i in range(n):
        task = source.get("train", i % source.n_records if source.n_records else i, 0)
        out.append(encode_prompt(tok, prompt_text(task.prompt, 0)))
    return out


def child(engine: str, spec: dict, threads: int, reps: int) -> dict:
    """Runs in its own process: one backend's figures."""
    import torch

    torch.set_num_threads(threads)
    if engine == "hf":
        from swarmrl.inference.hf import HFBackend

        backend = HFBackend(max_batch=max(BATCHES))
    else:
        from swarmrl.inference.vllm import VLLMBackend

        backend = VLLMBackend(max_batch=max(BATCHES), threads=threads, kv_cache_gb=4)
    t0 = time.perf_counter()
    backend.load(Path(spec["dir"]))
    out = {"engine": engine, "start_s": time.perf_counter() - t0}
    prompts = prompts_for(spec, max(BATCHES))
    seeds = list(range(1000, 1000 + len(prompts)))
    backend.generate(prompts[:8], seeds[:8], spec["max_new"], 1.0, 1.0)  # warm-up
    for batch in BATCHES:
        for proofs in (False, True):
            times, digest, n_tok = [], "", 0
            for _ in range(reps):
                if engine == "vllm":
                    backend.llm.reset_prefix_cache()  # each timed call starts cold
                t0 = time.perf_counter()
                got = backend.generate(
                    prompts[:batch], seeds[:batch], spec["max_new"], 1.0, 1.0, proofs
                )
                times.append(time.perf_counter() - t0)
                n_tok = sum(len(c.tokens) for c in got)
                digest = hashlib.sha256(json.dumps([c.tokens for c in got]).encode()).hexdigest()
            name = f"batch{batch}_{'proofs' if proofs else 'noproofs'}"
            out[name] = {
                "tokens": n_tok,
                "tok_per_s": n_tok / statistics.median(times),
                "digest": digest,
            }
    # The validator's pass over the last batch's samples: HF's prefill (states and
    # full logits of every generated position) against vLLM processing the same
    # tokens as a prompt (one step, no logits kept): the most vLLM could save there.
    seqs = [p + c.tokens[:-1] for p, c in zip(prompts, got, strict=True)]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        if engine == "hf":
            for _ in backend.prefill_batches(prompts, [c.tokens for c in got]):
                pass
        else:
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            backend.llm.reset_prefix_cache()
            backend.llm.generate(
                [TokensPrompt(prompt_token_ids=s) for s in seqs],
                SamplingParams(temperature=0.0, max_tokens=1, detokenize=False),
                use_tqdm=False,
            )
        times.append(time.perf_counter() - t0)
    out["prefill_tok_per_s"] = sum(map(len, seqs)) / statistics.median(times)
    loads, swaps = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.load(Path(spec["dir"]))
        loads.append(time.perf_counter() - t0)
        swaps.append(getattr(backend, "swap_s", None) or loads[-1])
    out["swap_s"] = statistics.median(swaps)  # the engine's in-place reload (vLLM)
    out["load_s"] = statistics.median(loads)  # with reading and checking the files
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "inference.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.spec), args.threads, args.reps)))
        return
    from swarmrl.inference.vllm import vllm_available

    if not vllm_available():
        print(json.dumps({"skipped": "vLLM is not installed (make vllm)"}))
        return
    cache = ROOT / "bench" / ".cache"
    result: dict = {"threads": args.threads, "reps": args.reps, "models": {}}
    for name in args.models.split(","):
        spec = dict(MODELS[name])
        spec["dir"] = str(hf_directory(spec["path"], cache))
        runs = {}
        for engine in ("hf", "vllm"):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", engine, "--spec", json.dumps(spec),
                 "--threads", str(args.threads), "--reps", str(args.reps)],
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            if proc.returncode != 0:
                sys.exit(f"{engine} on {name} failed:\n{proc.stderr[-3000:]}")
            runs[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
        hf, vl = runs["hf"], runs["vllm"]
        row = {"max_new_tokens": spec["max_new"], "vllm_start_s": vl["start_s"]}
        for key in hf:
            if not key.startswith("batch"):
                continue
            row[key] = {
                "hf_tok_per_s": hf[key]["tok_per_s"],
                "vllm_tok_per_s": vl[key]["tok_per_s"],
                "ratio": vl[key]["tok_per_s"] / hf[key]["tok_per_s"],
                "tokens": hf[key]["tokens"],
                "same_tokens": hf[key]["digest"] == vl[key]["digest"],
            }
        row["swap_s"] = {"hf": hf["swap_s"], "vllm": vl["swap_s"]}
        row["load_s"] = {"hf": hf["load_s"], "vllm": vl["load_s"]}
        row["prefill_tok_per_s"] = {
            "hf": hf["prefill_tok_per_s"],
            "vllm": vl["prefill_tok_per_s"],
            "ratio": vl["prefill_tok_per_s"] / hf["prefill_tok_per_s"],
        }
        row["goal_3x_with_proofs"] = all(row[f"batch{b}_proofs"]["ratio"] >= 3.0 for b in BATCHES)
        result["models"][name] = row
        if not all(v["same_tokens"] for k, v in row.items() if k.startswith("batch")):
            result["error"] = f"{name}: the backends generated different tokens (see same_tokens)"
        print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    if "error" in result:  # the ratios are not of equal work
        sys.exit(result["error"])


if __name__ == "__main__":
    main()
