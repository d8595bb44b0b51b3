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

Detection. For each dishonest behaviour, files are made by a worker that does
everything else honestly (sim/cheats.py, sim/tool_cheats.py, bench/verification_cheats.py)
and judged at the defaults. A caught file also gets its tokens to detect: the
completion tokens of the shortest leading run of its samples that the checks reject
on their own (the model checks are re-run on 1, 2, 4, ... samples; the per-sample checks
name the first failing sample), i.e. how much of the file a validator needs to read.
The claimed policy is a fine-tuned version (12 versions of GRPO-shaped AdamW steps at
the run's learning rate from the published model), so that its 1, 2 and 10 versions
older neighbours and its base exist.

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
whole matrix with a fine-tuning of 3 versions, SmolLM2 on one honest condition and its
stale behaviours.

The engines: the worker side runs the transformers engine; vLLM's, where it is
installed (`make vllm`), as a further condition. The validator runs its default
engine (transformers).

Usage: .venv/bin/python bench/verification_rates.py [--quick] [--models tiny,smollm2]
       [--tiny-rollouts 100000] [--smollm2-rollouts 5000] [--cheat-files 3]
       [--shard 0/1] [--only honest|detection] [--out runs/verification/rates.jsonl]
"""

from __future__ import annotations

import argparse
import fcntl
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

from rollout_files import Maker, issued, make_judge, small_run  # noqa: E402
from trajectory_envs import Echo  # noqa: E402
from verification_cheats import behaviours, fine_tuned_versions, save_version  # noqa: E402
from verification_report import calibration_key, report  # noqa: E402

from swarmrl.envs import environment as environment_module  # noqa: E402
from swarmrl.inference.vllm import vllm_available  # noqa: E402
from swarmrl.models.loading import load_model  # noqa: E402
from swarmrl.protocol.rollouts import read_rollouts, write_rollouts  # noqa: E402
from swarmrl.sim.registry import MULTI_TURN_CHEATS, make_cheat  # noqa: E402
from swarmrl.validator.checks import Reject, check_with_model  # noqa: E402
from swarmrl.validator.frozen import tolerance_fingerprint  # noqa: E402

SOURCES = {"tiny": ROOT / "models" / "tiny-reverse_text", "smollm2": "smollm2"}
# each model's task at two lengths (prompt and completion), and its files' shape
SHAPES = {
    ("tiny", "short"): ["task.name=reverse_text", "task.min_len=3", "task.max_len=6",
                        "sampling.max_new_tokens=12"],
    ("tiny", "long"): ["task.name=reverse_text", "task.min_len=12", "task.max_len=24",
                       "sampling.max_new_tokens=40"],
    ("smollm2", "short"): ["task.name=addition", "task.digits=2",
                           'task.instruction="Answer with the number only."',
                           "sampling.max_new_tokens=16"],
    ("smollm2", "long"): ["task.name=addition", "task.digits=4", "sampling.max_new_tokens=40"],
}  # fmt: skip
FILE_SHAPE = {"tiny": ["worker.group_size=8", "worker.groups_per_file=8"],
              "smollm2": ["worker.group_size=8", "worker.groups_per_file=4"]}  # fmt: skip
TOOLS = ['env.kind="tools"', "env.max_turns=3"]
# honest files are judged with the sampling check's tolerances lifted (and so nothing to
# calibrate): each file's figures are recorded, and compared with the thresholds later
LIFTED = ["validator.sampling_tolerance=10.0", "validator.logprob_tolerance=10.0",
          "validator.sampling_mean_tolerance=10.0", "validator.calibrate=false",
          "validator.version_check_ratio=1e-300"]  # fmt: skip
BATCHES = {"tiny": (1, 8, 64), "smollm2": (1, 32)}
VERSIONS = 12  # the claimed policy of the detection matrix: version 12 of a fine-tuning
KEPT = [0, VERSIONS - 10, VERSIONS - 2, VERSIONS - 1, VERSIONS]  # the versions saved
PASSES = 8  # rounds over the honest conditions (each loads its models once a round)
TRAINING = {"tiny": (2.5e-4, 2), "smollm2": (1e-5, 1)}  # configs' lr, optimizer steps


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


def provenance() -> dict:
    """What every record carries: the commit it was judged at and the fingerprint of the
    tolerances that judged it (validator/calibrate.py: only records under the frozen
    fingerprint count out of sample)."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    return {"commit": head or "unknown", "fingerprint": tolerance_fingerprint()}


def tuned_versions(model: str, work: Path) -> dict[str, dict[int, Path]]:
    """The fine-tuning of `model` the detection matrix and the honest `tuned` conditions
    share: dtype -> version -> directory, for the versions KEPT (made once per work
    directory)."""
    base = work / f"{model}-detect"
    dirs = {}
    for dtype in ("bfloat16", "float32"):
        if all((base / dtype / f"v{k}" / "config.json").exists() for k in KEPT):
            dirs[dtype] = {k: base / dtype / f"v{k}" for k in KEPT}
    if len(dirs) == 2:
        return dirs
    published = Versions(work).published(model, "float32")
    seed_cfg = run_config(base, published, model, "short", "single")
    rows = read_rollouts(Maker(seed_cfg, base, name="seed-rows").file()[1])
    lr, inner = TRAINING[model]
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # made once: all of the machine
    try:
        return fine_tuned_versions(
            SOURCES[model], rows, ["bfloat16", "float32"], base, KEPT, lr, inner
        )
    finally:
        torch.set_num_threads(threads)


class Log:
    """The results file: one JSON object per line, appended under a lock."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: the file is redone
                continue
        return out

    def add(self, record: dict) -> None:
        with open(self.path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(record) + "\n")
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


class Versions:
    """The published versions of a model, made once per work directory and dtype."""

    def __init__(self, work: Path):
        self.work = work

    def published(self, model: str, dtype: str) -> Path:
        out = self.work / f"{model}-{dtype}" / "published"
        if not (out / "config.json").exists():
            save_version(load_model(str(SOURCES[model])), SOURCES[model], dtype, out)
        return out


def with_echo(cfg):
    """Registers the Echo environment for a tool run's config (the tiny model writes no
    real call); returns the config."""
    environment_module._BUILT[environment_module.built_key(cfg)] = Echo()
    return cfg


def run_config(work: Path, model_dir: Path, model: str, length: str, turns: str, *extra):
    overrides = [*FILE_SHAPE[model], *SHAPES[(model, length)], *extra]
    if turns == "tools":
        overrides += TOOLS
    cfg = small_run(work, model_dir, *overrides)
    return with_echo(cfg) if turns == "tools" else cfg


def honest(c: dict, files: int, done: int, versions: Versions, work: Path, log: Log) -> None:
    """`files` more honest files of condition `c` (its files `done`+1 ...)."""
    from swarmrl.inference.vllm import VLLMBackend

    cid = cond_id(c)
    model_dir, older = claimed(c, versions, work)
    cfg = run_config(work / cid, model_dir, c["model"], c["length"], c["turns"], *LIFTED)
    torch.set_num_threads(c["worker_threads"])
    backend = None
    if c["engine"] == "vllm":
        backend = VLLMBackend(max_batch=c["batch"], threads=c["worker_threads"], kv_cache_gb=2)
    maker = Maker(cfg, work / cid, name=f"honest-{cid}", max_batch=c["batch"], backend=backend)
    maker.counter = done  # a continued run makes new files, not the same ones again
    maker.policy = len(older)
    judge = make_judge(cfg, work / cid, older)
    source = "base" if not older else "run" if c["model"] in RUN_VERSIONS else "fine-tuning"
    stamp = provenance() | {"claimed": str(model_dir), "version_source": source}
    for _ in range(files):
        torch.set_num_threads(c["worker_threads"])
        key, data = maker.file()
        torch.set_num_threads(c["validator_threads"])
        v = judge.judge(key, data, issued=issued(key))
        log.add({"kind": "honest", "cond": cid, **c, "rollouts": v.n_samples or len(read_rollouts(data)),
                 "tokens": v.n_tokens, "check": v.check, "reason": v.reason, "stats": v.stats,
                 **stamp})  # fmt: skip


RUN_VERSIONS: dict[str, Path] = {}  # model -> a real run's weights directory (--run-versions)


def run_versions(model: str, dtype: str, work: Path) -> list[Path] | None:
    """The last three versions a real run of `model` published (its weights directory's
    step_<n>/, float32 on a CPU trainer), oldest first, in `dtype`: a bfloat16 copy is
    rounded to nearest from the float32 version, as a trainer that publishes bfloat16
    writes it. None when no run was given for the model."""
    root = RUN_VERSIONS.get(model)
    if root is None:
        return None
    steps = sorted(root.glob("step_*/config.json"))[-3:]
    if len(steps) < 3:
        raise SystemExit(f"{root}: fewer than three versions (step_<n>/) to judge against")
    out = []
    for cfg in steps:
        src = cfg.parent
        if dtype == "float32":
            out.append(src)
            continue
        dst = work / f"{model}-run-{dtype}" / src.name
        if not (dst / "config.json").exists():
            save_version(load_model(str(src)), src, dtype, dst)
        out.append(dst)
    return out


def claimed(c: dict, versions: Versions, work: Path) -> tuple[Path, list[Path]]:
    """The version a condition's files claim, and the versions before it that its
    validator holds (oldest first): the published model alone (`base`), or (`tuned`)
    the last version of a real run (`--run-versions`) with the two before it, else
    version VERSIONS of the bench's own fine-tuning with the two before it."""
    if c.get("version", "base") == "base":
        return versions.published(c["model"], c["dtype"]), []
    run = run_versions(c["model"], c["dtype"], work)
    if run is not None:
        return run[-1], run[:-1]
    dirs = tuned_versions(c["model"], work)[c["dtype"]]
    return dirs[VERSIONS], [dirs[VERSIONS - 2], dirs[VERSIONS - 1]]


def calibrations(model: str, conds: list[dict], work: Path, log: Log) -> None:
    """What a validator of each honest condition calibrates its tolerances to (it does so
    once, on its first version): one record per dtype, shape and validator threads."""
    have = {r["cond"] for r in log.records() if r["kind"] == "calibration"}
    for c in conds:
        cid = calibration_key(c)
        if cid in have:
            continue
        have.add(cid)
        torch.set_num_threads(c["validator_threads"])
        model_dir, _ = claimed(c, Versions(work), work)
        cfg = run_config(work / cid, model_dir, model, c["length"], c["turns"])
        judge = make_judge(cfg, work / cid)
        cal = judge.calibrations[c["dtype"]]  # None: float32, nothing to tighten
        ctx = judge.ctx
        used = {"logprob": ctx.logprob_tolerance, "sampling": ctx.sampling_tolerance,
                "sampling_mean": ctx.sampling_mean_tolerance}  # fmt: skip
        log.add({"kind": "calibration", "cond": cid, "model": model, "dtype": c["dtype"],
                 "length": c["length"], "turns": c["turns"],
                 "validator_threads": c["validator_threads"], "version": c["version"],
                 "measured": cal and cal.measured, "tolerances": used, **provenance()})  # fmt: skip


def honest_rates(model: str, target: int, quick: bool, shard, work: Path, log: Log, t0) -> None:
    """At least `target` honest rollouts of `model`, spread evenly over its conditions
    (this process's `shard` of them), less what the log holds already."""
    conds = conditions(model)
    per_file = 64 if model == "tiny" else 32
    if quick:  # every 5th tiny condition (all kinds), and one of SmolLM2's (a tuned one)
        conds = (
            conds[::5]
            if model == "tiny"
            else [c for c in conds if c["batch"] != 1 and c["version"] == "tuned"][:1]
        )
    # files per condition: batch 1 decodes a row at a time (10-30x the time of a batch),
    # so it gets a quarter of the others' share (SmolLM2: a tenth); the total still
    # reaches `target`
    one = 0.25 if model == "tiny" else 0.1
    weight = {id(c): one if c["batch"] == 1 else 1.0 for c in conds}
    total = sum(weight.values())
    if shard[0] == 0:
        calibrations(model, conds, work, log)
    done: dict[str, int] = {}
    for r in log.records():
        if r["kind"] == "honest":
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
            honest(c, upto - have, have, Versions(work), work, log)
            done[cond_id(c)] = upto
            print(f"{cond_id(c)}: {upto} of {want} files ({time.time() - t0:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip


def prefix_rejected(judge, ctx, rows: list[dict], policy: int) -> bool:
    """Whether the model checks (7, 8 and the version check 9) reject these samples."""
    try:
        errors: list[float] = []
        check_with_model(ctx, judge.backend, rows, errors)
        judge.check_versions(ctx, policy, rows, errors)
        return False
    except Reject:
        return True


def tokens_to_detect(
    judge, key: str, data: bytes, v, full: bool = False
) -> tuple[int | None, list]:
    """The completion tokens of the shortest leading run of the file's samples that the
    checks reject on their own, and the curve it was found on: [tokens read, samples
    read, rejected] at 1, 2, 4, ... samples. `full`: the whole curve, rejected or not
    (an honest file's: its false rejections at each length)."""
    rows = read_rollouts(data)
    lengths = [len(r["completion_tokens"]) for r in rows]
    if v.accepted and not full:
        return None, [[sum(lengths), len(rows), False]]
    if not v.accepted and v.check not in ("proof", "sampling", "version"):
        first = min(v.samples) if v.samples else len(rows) - 1  # per-sample checks name it
        return sum(lengths[: first + 1]), [[sum(lengths[: first + 1]), first + 1, True]]
    ctx = judge.ctx.with_issued(issued(key))
    policy = rows[0]["policy_step"]
    curve, k, need = [], 1, None
    while True:
        k = min(k, len(rows))
        caught = prefix_rejected(judge, ctx, rows[:k], policy)
        curve.append([sum(lengths[:k]), k, caught])
        if caught and need is None:
            need = sum(lengths[:k])
            if not full:
                return need, curve
        if k == len(rows):  # only the whole file's other checks caught it
            return (need or (None if v.accepted else sum(lengths))), curve
        k *= 2


def judged(judge, behaviour: str, key: str, data: bytes, model: str, dtype: str) -> dict:
    v = judge.judge(key, data, issued=issued(key))
    if QUICK[0] and model == "smollm2":
        need, curve = None, []
    else:
        need, curve = tokens_to_detect(judge, key, data, v, full=behaviour == "honest")
    tokens = sum(len(r["completion_tokens"]) for r in read_rollouts(data))
    return {"kind": "cheat", "model": model, "dtype": dtype, "behaviour": behaviour,
            "caught": not v.accepted, "check": v.check or "accepted", "reason": v.reason,
            "file_tokens": tokens, "tokens_to_detect": need, "curve": curve, "stats": v.stats,
            **provenance()}  # fmt: skip


def policy_distance(model: str, work: Path, log: Log) -> None:
    """How far weight noise of 0.1% of each tensor's spread (which no check catches)
    moves the policy, beside how far one training step moves it: the mean per-token KL
    divergence from the claimed version (float32) to the noised one and to the version
    before it, over the completions of an honest file of the claimed version. The
    trainer corrects both the same way (importance weights from the log-probs the worker
    reports), and the run takes honest files up to `async_level` versions old, so noise
    that moves the policy less than one step harms no more than a worker one version
    behind."""
    from swarmrl.inference.hf import HFBackend
    from swarmrl.sim.cheats import perturb

    torch.set_num_threads(1)
    dirs = tuned_versions(model, work)["float32"]
    cfg = run_config(work / f"{model}-distance", dirs[VERSIONS], model, "short", "single")
    rows = read_rollouts(Maker(cfg, work / f"{model}-distance", name="distance").file()[1])
    engines = {}
    for name, path in (("policy", dirs[VERSIONS]), ("one_step", dirs[VERSIONS - 1]),
                       ("noise-0.001", dirs[VERSIONS])):  # fmt: skip
        engines[name] = HFBackend()
        engines[name].load(path)
    perturb(engines["noise-0.001"].model, 0.001, 0)

    def logprobs(engine) -> list[torch.Tensor]:
        out = [None] * len(rows)
        for batch in engine.prefill_batches(
            [r["prompt_tokens"] for r in rows], [r["completion_tokens"] for r in rows],
            max_tokens=16384,
        ):  # fmt: skip
            for j, _, logits in batch:
                out[j] = torch.log_softmax(logits.float(), dim=-1)
        return out

    mine = logprobs(engines["policy"])
    record = {"kind": "distance", "model": model, "tokens": sum(len(x) for x in mine),
              **provenance()}  # fmt: skip
    for name in ("one_step", "noise-0.001"):
        theirs = logprobs(engines[name])
        kl = torch.cat([(p.exp() * (p - q)).sum(-1) for p, q in zip(mine, theirs, strict=True)])
        record[f"kl_{name}"] = float(kl.mean())
    record["noise_over_one_step"] = record["kl_noise-0.001"] / record["kl_one_step"]
    log.add(record)


# a worker that generates with an older version than the one it claims, by how much older
OLDER = {"stale_1": VERSIONS - 1, "stale_2": VERSIONS - 2, "older-10": VERSIONS - 10, "base": 0}
# `--quick` judges SmolLM2 (half a minute a file here) on these behaviours only, by dtype,
# without tokens-to-detect curves; the tiny model on every behaviour, with them
QUICK_SMOLLM2 = {"bfloat16": ("honest", "stale_1", "stale_2"), "float32": ("stale_1", "stale_2")}
QUICK: list[bool] = [False]


def detection(model: str, files: int, work: Path, log: Log, seen: dict) -> None:
    """The detection matrix of `model`: every behaviour, `files` files each (minus those
    in the log already), against version 12 of a fine-tuning, published in bfloat16
    (and in float32: the stale versions, and the bfloat16 worker that claims float32).
    The validator holds the two versions before the claimed one (the version check)."""
    torch.set_num_threads(1)
    base = work / f"{model}-detect"
    dirs = tuned_versions(model, work)
    runs = [("bfloat16", behaviours("bfloat16")), ("float32", {})]
    runs[1][1]["bf16-claims-f32"] = behaviours("float32")["bf16-claims-f32"]
    for dtype, cheats in runs:
        claimed = dirs[dtype][VERSIONS]
        older_dirs = [dirs[dtype][VERSIONS - 2], dirs[dtype][VERSIONS - 1]]
        cfg = run_config(base / f"run-{dtype}", claimed, model, "short", "single")
        judge = make_judge(cfg, base / f"run-{dtype}", older_dirs)
        maker = Maker(cfg, base / f"run-{dtype}", name="cheater")
        maker.counter = 1000 * len(seen)
        maker.policy = len(older_dirs)

        def todo(name, dtype=dtype):
            if QUICK[0] and model == "smollm2" and name not in QUICK_SMOLLM2[dtype]:
                return 0
            return max(0, files - seen.get((model, dtype, name), 0))

        for _ in range(todo("honest")):  # the control, and the honest curve
            log.add(judged(judge, "honest", *maker.file(), model, dtype))
        for name, cheat in cheats.items():
            for rep in range(todo(name)):
                if hasattr(cheat, "seed"):
                    cheat.seed = rep
                log.add(judged(judge, name, *maker.file(cheat), model, dtype))
        for name, k in OLDER.items():
            if not todo(name) or (dtype == "float32" and not name.startswith("stale")):
                continue
            other = run_config(base / f"run-{dtype}", dirs[dtype][k], model, "short", "single")
            liar = Maker(other, base / f"run-{dtype}", name="cheater")  # same node, same run
            liar.counter, liar.policy = maker.counter + 100, maker.policy
            for _ in range(todo(name)):
                log.add(judged(judge, name, *liar.file(), model, dtype))
            maker.counter = liar.counter
        if dtype != "bfloat16":
            continue
        for _ in range(todo("replay")):  # an honest file passed off as a later assignment's
            _, first = maker.file(step=maker.policy + 1)
            key, _ = maker.file(step=maker.policy + 2)
            later = maker.policy + 2
            relabelled = write_rollouts([r | {"step": later} for r in read_rollouts(first)])
            log.add(judged(judge, "replay", key, relabelled, model, dtype))
    if model == "tiny":  # the environment's cheats, on tool trajectories
        older_dirs = [dirs["bfloat16"][VERSIONS - 2], dirs["bfloat16"][VERSIONS - 1]]
        cfg = run_config(base / "run-tools", dirs["bfloat16"][VERSIONS], model, "short", "tools")
        judge = make_judge(cfg, base / "run-tools", older_dirs)
        maker = Maker(cfg, base / "run-tools", name="cheater")
        maker.counter = 1000 * len(seen)
        maker.policy = len(older_dirs)
        # loose-tool-limits needs tools with limits (the calculator, the Python tool), which
        # the tiny model never calls: tests/unit/test_multiturn.py catches it on one
        for name in [n for n in MULTI_TURN_CHEATS if n != "loose-tool-limits"]:
            for rep in range(max(0, files - seen.get((model, "bfloat16", name), 0))):
                data = maker.file(make_cheat(name, seed=rep))
                log.add(judged(judge, name, *data, model, "bfloat16"))


def shorter_fine_tuning(versions: int) -> None:
    """A fine-tuning of `versions` versions in place of VERSIONS (`--quick`: a quarter
    of the time; the policy ten versions older is then not in the matrix)."""
    global VERSIONS, KEPT
    VERSIONS = versions
    KEPT = list(range(versions + 1))
    OLDER.pop("older-10", None)
    OLDER.update({"stale_1": versions - 1, "stale_2": versions - 2, "base": 0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small run into its own file")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--tiny-rollouts", type=int, default=100_000)
    ap.add_argument("--smollm2-rollouts", type=int, default=5_000)
    ap.add_argument("--cheat-files", type=int, default=3, help="files per behaviour")
    ap.add_argument("--shard", default="0/1", help="i/n: this process's share of conditions")
    ap.add_argument("--only", choices=["honest", "detection"], default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="versions and keys (default: beside --out)")
    ap.add_argument(
        "--run-versions",
        default="",
        help="model=dir,...: a real run's weights "
        "directory per model, whose last three versions the tuned conditions use",
    )
    args = ap.parse_args()
    for item in filter(None, args.run_versions.split(",")):
        model, path = item.split("=", 1)
        RUN_VERSIONS[model] = Path(path)
    QUICK[0] = args.quick
    if args.quick:
        args.tiny_rollouts, args.smollm2_rollouts, args.cheat_files = 1536, 64, 1
        shorter_fine_tuning(3)
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
    if args.only != "detection":
        targets = {"tiny": args.tiny_rollouts, "smollm2": args.smollm2_rollouts}
        for model in models:
            honest_rates(model, targets[model], args.quick, (shard, shards), work, log, t0)
    if args.only != "honest" and shard == 0:
        for model in models:
            seen: dict = {}
            for r in log.records():
                if r["kind"] == "cheat" and r["model"] == model:
                    k = (r["model"], r["dtype"], r["behaviour"])
                    seen[k] = seen.get(k, 0) + 1
            detection(model, args.cheat_files, work, log, seen)
            if not any(r["kind"] == "distance" and r["model"] == model for r in log.records()):
                policy_distance(model, work, log)
            print(f"{model} detection ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    result = report(log.records())
    result["seconds"] = round(time.time() - t0, 1)
    result["out"] = str(out)
    result["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__,
                         "vllm": vllm_available()}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
