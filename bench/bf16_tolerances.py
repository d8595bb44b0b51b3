"""The validator's honest error distributions in float32 and bfloat16 on this CPU, and
the cheat matrix in bfloat16: what the bfloat16 defaults of the checks are set from.

For each model (the warm-started tiny model on its text-reversal task, and
SmolLM2-135M-Instruct on `make run`'s addition task) and each dtype, the weights are
published as a version in that dtype (rounded to nearest from float32), then honest
rollout files are made and judged by the real checks (bench/rollout_files.py: a
worker's rows, the validator's Judge). Every pairing of worker threads and validator
threads in {1, 2} is run, with worker batch sizes 1 and 16, so the two sides'
kernels and reduction orders differ as they do across machines. The figures are the
per-file statistics the verdicts record, judged with the tolerances lifted so that
every honest file's figures are seen: the mean |log-prob| error, the worst
sampling margin (how far a competitor's noisy score came above the chosen token's,
in logits/T), and TOPLOC's largest exponent mismatches and mantissa mean and median
per chunk. Then each cheat makes files in bfloat16 and the check that caught each is
recorded, under the run's defaults for that dtype.

Only the transformers engine is measured here; vLLM's CPU build is not installed on
this machine (`make vllm` needs torch's +cpu build from PyTorch's own index).

Usage: .venv/bin/python bench/bf16_tolerances.py [--files 3] [--models tiny,smollm2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rollout_files import Maker, issued, make_judge, small_run  # noqa: E402
from verification_cheats import save_version  # noqa: E402

from swarmrl.models.loading import load_model  # noqa: E402
from swarmrl.sim.registry import SINGLE_TURN_CHEATS, make_cheat  # noqa: E402
from swarmrl.validator.loop import logprob_tolerance, sampling_tolerance  # noqa: E402

MODELS = {
    "tiny": (ROOT / "models" / "tiny-reverse_text", ["task.name=reverse_text"]),
    "smollm2": (
        "smollm2",
        [
            "task.name=addition",
            "task.digits=2",
            'task.instruction="Answer with the number only."',
            "sampling.max_new_tokens=16",
        ],
    ),  # fmt: skip
}
STATS = ["mean_logprob_error", "worst_sampling_margin", "mean_sampling_margin",
         "max_exp_mismatches", "max_mantissa_mean", "max_mantissa_median"]  # fmt: skip
LIFTED = ["validator.sampling_tolerance=10.0", "validator.logprob_tolerance=10.0",
          "validator.sampling_mean_tolerance=10.0"]  # fmt: skip
# cheats that need more than a model's files (the curriculum, a second file)
SKIP = {"easy-level", "replay"}


def version_dir(source, dtype: str, out: Path) -> Path:
    """`source` published as a version in `dtype`, as the trainer writes one."""
    return save_version(load_model(str(source)), source, dtype, out)


def spread(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": xs[len(xs) // 2], "p90": xs[int(0.9 * (len(xs) - 1))], "max": xs[-1]}


def honest(cfg, tmp: Path, files: int) -> dict:
    per: dict[str, list[float]] = {s: [] for s in STATS}
    rejected, samples = [], 0
    for wt in (1, 2):
        for vt in (1, 2):
            for batch in (1, 16):
                tag = f"w{wt}v{vt}b{batch}"
                torch.set_num_threads(wt)
                maker = Maker(cfg, tmp, name=f"honest-{tag}", max_batch=batch)
                made = [maker.file() for _ in range(files)]
                torch.set_num_threads(vt)
                judge = make_judge(cfg, tmp / f"judge-{tag}")
                for key, data in made:
                    v = judge.judge(key, data, issued=issued(key))
                    samples += v.n_samples
                    if not v.accepted:
                        rejected.append({"threads": tag, "check": v.check, "reason": v.reason})
                    for s in STATS:
                        if s in v.stats:
                            per[s].append(float(v.stats[s]))
    torch.set_num_threads(1)
    return {
        "files": len(per["mean_logprob_error"]),
        "samples": samples,
        "rejected": rejected,
        **{s: spread(xs) for s, xs in per.items() if xs},
    }


def cheats(cfg, tmp: Path, reps: int) -> dict:
    out = {}
    judge = make_judge(cfg, tmp / "judge-cheats")
    maker = Maker(cfg, tmp, name="cheater")
    for name in SINGLE_TURN_CHEATS:  # the run has no tool environment
        if name in SKIP:
            continue
        caught = []
        for rep in range(reps):
            key, data = maker.file(make_cheat(name, seed=rep))
            v = judge.judge(key, data, issued=issued(key))
            caught.append("accepted" if v.accepted else v.check)
        out[name] = caught
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3, help="honest files per pairing")
    ap.add_argument("--cheat-reps", type=int, default=2)
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result = {"machine_cpus": torch.get_num_threads(), "torch": torch.__version__, "models": {}}
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            source, overrides = MODELS[name]
            result["models"][name] = {}
            for dtype in ("float32", "bfloat16"):
                t0 = time.time()
                tmp = Path(d) / f"{name}-{dtype}"
                model = version_dir(source, dtype, tmp / "version")
                cfg = small_run(tmp, model, *overrides)
                # honest files are judged with the tolerances lifted, to measure their spread
                lifted = small_run(tmp, model, *overrides, *LIFTED)
                entry = {"honest": honest(lifted, tmp, args.files)}
                entry["defaults"] = {
                    "sampling_tolerance": sampling_tolerance(cfg, dtype),
                    "logprob_tolerance": logprob_tolerance(cfg, dtype),
                }
                if dtype == "bfloat16":
                    entry["cheats"] = cheats(cfg, tmp, args.cheat_reps)
                entry["seconds"] = round(time.time() - t0, 1)
                result["models"][name][dtype] = entry
                print(f"{name} {dtype}: {json.dumps(entry)}", file=sys.stderr)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
