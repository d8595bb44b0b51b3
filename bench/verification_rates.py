"""How often the validator rejects an honest worker, and how fast it catches each kind
of dishonest one: the rates docs/verification.md quotes.

Honest rates. Honest rollout files are made as a worker makes them and judged by the
real validator (bench/rollout_files.py: a worker's rows, the validator's `Judge`)
across the conditions of an honest swarm: the version's dtype (float32, bfloat16),
worker threads 1 and 2 (the validator on the other count, so the two sides' kernels
and reduction orders differ), worker batch sizes from 1 to 64, short and long prompts
and completions, and single-turn and tool trajectories (the tiny model's, with the
deterministic `Echo` environment of bench/trajectory_envs.py: it writes no real tool
call). The tolerances of the sampling check are lifted while judging, so that every
honest file's statistics are recorded; a file counts as falsely rejected when any
check failed or a statistic is past its default for the dtype. Reported per model and
condition: rollouts, files, false rejections by check, and for every statistic its
honest maximum, its threshold and the margin between them in honest standard
deviations.

Detection (bench/verification_detection.py). For each dishonest behaviour, files made
by a worker that does everything else honestly, judged at the defaults, with the
tokens a validator needs to read to catch it; `--behaviours` picks some of them (a
detection run of many files on the stale behaviours, for one).

Each judged file is one JSON line appended to `--out` (under a file lock), so a long
run can be stopped and continued, and shards (`--shard i/n`, conditions split among
processes) can run side by side; the figures are computed from every line of the file.
Every line carries the commit and the tolerance fingerprint it was judged under:
honest files count out of sample (`out_of_sample` in the report) only at or after the
commit frozen in docs/verification-frozen.json, under its fingerprint.

Honest conditions run on the published model (`base`) and on a later version
(`tuned`): with `--run-versions tiny=DIR,smollm2=DIR` the last three versions a real
run published (its weights directory: `make run`'s runs/addition-seed0/weights), else
the bench's own fine-tuning; the validator holds the two versions before the claimed
one, as in a run, so the version check (check 9) is judged too.

`--quick` is a small run into its own file and work directory: the tiny model's
whole matrix with a fine-tuning of 3 versions, SmolLM2's stale behaviours beside an
honest control file (no honest-rate conditions, no weight-noise distance: a SmolLM2
file takes half a minute here, a calibration one to two minutes).

The engines: the worker side runs the transformers engine; vLLM's, where it is
installed (`make vllm`), as a further condition. The validator runs its default
engine (transformers).

Usage: .venv/bin/python bench/verification_rates.py [--quick] [--models tiny,smollm2]
       [--tiny-rollouts 100000] [--smollm2-rollouts 5000] [--cheat-files 3]
       [--behaviours stale_1,stale_2,honest] [--shard 0/1] [--only honest|detection]
       [--out runs/verification/rates.jsonl] [--run-versions tiny=DIR,smollm2=DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rollout_files import Maker, issued, make_judge, small_run  # noqa: E402, F401
from verification_detection import detection, judged, policy_distance  # noqa: E402, F401
from verification_report import calibration_key, frozen_test, report  # noqa: E402
from verification_setup import (  # noqa: E402
    Log,
    Matrix,
    claimed,
    provenance,
    run_config,
)

from swarmrl.inference.vllm import vllm_available  # noqa: E402
from swarmrl.protocol.rollouts import read_rollouts  # noqa: E402
from swarmrl.validator.frozen import tolerance_fingerprint  # noqa: E402

# honest files are judged with the sampling check's tolerances lifted (and so nothing to
# calibrate): each file's figures are recorded, and compared with the thresholds later
LIFTED = ["validator.sampling_tolerance=10.0", "validator.logprob_tolerance=10.0",
          "validator.sampling_mean_tolerance=10.0", "validator.calibrate=false",
          "validator.version_check_ratio=1e-300", "validator.version_draws_alpha=1e-300"]  # fmt: skip
BATCHES = {"tiny": (1, 8, 64), "smollm2": (1, 32)}
PASSES = 8  # rounds over the honest conditions (each loads its models once a round)


def conditions(model: str) -> list[dict]:
    engines = ["hf"] + (["vllm"] if vllm_available() else [])
    out = []
    for dtype in ("bfloat16", "float32"):
        for engine in engines:
            for wt in (1, 2):
                for batch in BATCHES[model]:
                    if model == "smollm2" and batch == 1 and wt == 2:
                        continue  # a file took 18 min here (two threads, a busy machine)
                    for length in ("short", "long"):
                        for turns in ("single", "tools") if model == "tiny" else ("single",):
                            for version in ("base", "tuned"):
                                out.append({"model": model, "dtype": dtype, "engine": engine,
                                            "worker_threads": wt, "validator_threads": 3 - wt,
                                            "batch": batch, "length": length, "turns": turns,
                                            "version": version})  # fmt: skip
    return out


def cond_id(c: dict) -> str:
    return "{model}-{dtype}-{engine}-w{worker_threads}v{validator_threads}-b{batch}-{length}-{turns}-{version}".format(
        **c
    )


def honest(m: Matrix, c: dict, files: int, done: int, work: Path, log: Log) -> None:
    """`files` more honest files of condition `c` (its files `done`+1 ..., new seeds)."""
    from swarmrl.inference.vllm import VLLMBackend

    cid = cond_id(c)
    model_dir, older = claimed(m, c, work)
    cfg = run_config(work / cid, model_dir, c["model"], c["length"], c["turns"], *LIFTED)
    torch.set_num_threads(c["worker_threads"])
    backend = None
    if c["engine"] == "vllm":
        backend = VLLMBackend(max_batch=c["batch"], threads=c["worker_threads"], kv_cache_gb=2)
    maker = Maker(cfg, work / cid, name=f"honest-{cid}", max_batch=c["batch"], backend=backend)
    maker.counter = done  # a continued run makes new files, not the same ones again
    maker.policy = len(older)
    judge = make_judge(cfg, work / cid, older)
    source = "base" if not older else "run" if c["model"] in m.run_versions else "fine-tuning"
    stamp = provenance() | {"claimed": str(model_dir), "version_source": source}
    for _ in range(files):
        torch.set_num_threads(c["worker_threads"])
        key, data = maker.file()
        torch.set_num_threads(c["validator_threads"])
        v = judge.judge(key, data, issued=issued(key))
        log.add({"kind": "honest", "cond": cid, **c, "rollouts": v.n_samples or len(read_rollouts(data)),
                 "tokens": v.n_tokens, "check": v.check, "reason": v.reason, "stats": v.stats,
                 **stamp})  # fmt: skip


def calibrations(m: Matrix, model: str, conds: list[dict], work: Path, log: Log) -> None:
    """What a validator of each honest condition calibrates its tolerances to (it does so
    once, on its first version): one record per dtype, shape and validator threads,
    under today's tolerances (a record under another fingerprint is measured again)."""
    today = tolerance_fingerprint()
    have = {r["cond"] for r in log.records()
            if r["kind"] == "calibration" and r.get("fingerprint") == today}  # fmt: skip
    for c in conds:
        cid = calibration_key(c)
        if cid in have:
            continue
        have.add(cid)
        torch.set_num_threads(c["validator_threads"])
        model_dir, _ = claimed(m, c, work)
        cfg = run_config(work / cid, model_dir, model, c["length"], c["turns"])
        judge = make_judge(cfg, work / cid)
        cal = judge.calibrations[c["dtype"]]  # None: float32, nothing to tighten
        ctx = judge.ctx
        used = {"logprob": ctx.logprob_tolerance, "sampling": ctx.sampling_tolerance,
                "sampling_mean": ctx.sampling_mean_tolerance}  # fmt: skip
        if ctx.logprob_noise is not None:  # a short file's allowance (validator/calibrate.py)
            used["noise"] = dataclasses.asdict(ctx.logprob_noise)
        log.add({"kind": "calibration", "cond": cid, "model": model, "dtype": c["dtype"],
                 "length": c["length"], "turns": c["turns"],
                 "validator_threads": c["validator_threads"], "version": c["version"],
                 "measured": cal and cal.measured, "tolerances": used, **provenance()})  # fmt: skip


def honest_rates(
    m: Matrix, model: str, target: int, shard, work: Path, log: Log, t0, calibrate: bool = True
) -> None:
    """At least `target` honest rollouts of `model`, spread evenly over its conditions
    (this process's `shard` of them), less what the log holds already."""
    conds = conditions(model)
    per_file = 64 if model == "tiny" else 32
    if m.quick:  # every 5th tiny condition (all kinds); SmolLM2's honest files are the
        conds = conds[::5] if model == "tiny" else []  # detection's control only
    # files per condition: batch 1 decodes a row at a time (10-30x the time of a batch),
    # so it gets a quarter of the others' share (SmolLM2: a tenth); the total still
    # reaches `target`
    one = 0.25 if model == "tiny" else 0.1
    weight = {id(c): one if c["batch"] == 1 else 1.0 for c in conds}
    total = sum(weight.values())
    if shard[0] == 0 and calibrate:  # else another process makes them (--only calibrations)
        calibrations(m, model, conds, work, log)
    # files judged under today's tolerances (a new freeze counts anew), and all files
    # made (a new file's seeds follow them all: none is made twice)
    done: dict[str, int] = {}
    made: dict[str, int] = {}
    today = tolerance_fingerprint()
    for r in log.records():
        if r["kind"] == "honest":
            made[r["cond"]] = made.get(r["cond"], 0) + 1
            if r.get("fingerprint") == today:
                done[r["cond"]] = done.get(r["cond"], 0) + 1
    # in PASSES rounds over the conditions, a share of each one's files a round: a run
    # stopped early has judged every condition, not the first ones only
    for round_ in range(1, PASSES + 1):
        for i, c in enumerate(conds):
            have = done.get(cond_id(c), 0)
            want = max(1, math.ceil(target * weight[id(c)] / total / per_file))
            upto = math.ceil(want * round_ / PASSES)
            if i % shard[1] != shard[0] or have >= upto:
                continue
            honest(m, c, upto - have, made.get(cond_id(c), 0), work, log)
            made[cond_id(c)] = made.get(cond_id(c), 0) + upto - have
            done[cond_id(c)] = upto
            print(f"{cond_id(c)}: {upto} of {want} files ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small run into its own file")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--tiny-rollouts", type=int, default=100_000)
    ap.add_argument("--smollm2-rollouts", type=int, default=5_000)
    ap.add_argument("--cheat-files", type=int, default=3, help="files per behaviour")
    ap.add_argument("--behaviours", default="", help="a,b,...: only these (default: all)")
    ap.add_argument("--shard", default="0/1", help="i/n: this process's share of conditions")
    ap.add_argument(
        "--only",
        choices=["honest", "detection", "calibrations"],
        default=None,
        help="calibrations: only the honest conditions' calibrations, which shard 0 makes "
        "first otherwise (a process of their own beside the shards' honest files, with "
        "--skip-calibrations there)",
    )
    ap.add_argument("--skip-calibrations", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="versions and keys (default: beside --out)")
    ap.add_argument(
        "--run-versions",
        default="",
        help="model=dir,...: a real run's weights "
        "directory per model, whose last three versions the tuned conditions use",
    )
    args = ap.parse_args()
    m = Matrix(quick=args.quick)
    for item in filter(None, args.run_versions.split(",")):
        model, path = item.split("=", 1)
        m.run_versions[model] = Path(path)
    if args.quick:  # a fine-tuning of 3 versions: a quarter of the time, no `older-10`
        args.tiny_rollouts, args.smollm2_rollouts, args.cheat_files = 1536, 64, 1
        m.versions = 3
    only = set(args.behaviours.split(",")) if args.behaviours else None
    out = Path(
        args.out
        or ROOT / "runs" / "verification" / ("quick.jsonl" if args.quick else "rates.jsonl")
    )
    if args.quick and args.out is None and out.exists():
        out.unlink()  # quick runs start afresh
    work = Path(args.work or out.parent / ("work-quick" if args.quick else "work"))
    log = Log(out)
    shard, shards = map(int, args.shard.split("/"))
    models = args.models.split(",")
    t0 = time.time()
    if args.only == "calibrations":
        for model in models:
            calibrations(m, model, conditions(model), work, log)
        return
    if args.only != "detection":
        targets = {"tiny": args.tiny_rollouts, "smollm2": args.smollm2_rollouts}
        for model in models:
            honest_rates(m, model, targets[model], (shard, shards), work, log, t0,
                         calibrate=not args.skip_calibrations)  # fmt: skip
    if args.only != "honest" and shard == 0:
        for model in models:
            seen: dict = {}  # files judged by today's rule (under every freeze)
            today, written = frozen_test(latest=True), 0
            for r in log.records():
                if r["kind"] == "cheat" and r["model"] == model:
                    written += 1
                    if today(r):
                        k = (r["model"], r["dtype"], r["behaviour"])
                        seen[k] = seen.get(k, 0) + 1
            detection(m, model, args.cheat_files, work, log, seen, written, only)
            distance = any(r["kind"] == "distance" and r["model"] == model for r in log.records())
            if not distance and only is None and not (m.quick and model == "smollm2"):
                policy_distance(m, model, work, log)
            print(f"{model} detection ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    result = report(log.records())
    result["seconds"] = round(time.time() - t0, 1)
    result["out"] = str(out)
    result["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__,
                         "vllm": vllm_available()}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
