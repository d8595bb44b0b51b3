"""The verification bench's detection matrix (bench/verification_rates.py runs it): for
each dishonest behaviour, files made by a worker that does everything else honestly
(sim/cheats.py, sim/tool_cheats.py, bench/verification_cheats.py) and judged at the
defaults. A caught file also gets its tokens to detect: the completion tokens of the
shortest leading run of its samples that the checks reject on their own (the model
checks are re-run on 1, 2, 4, ... samples; the per-sample checks name the first failing
sample), i.e. how much of the file a validator needs to read. The honest control gets
the whole curve, so that the report can set each length's detection beside the honest
rejections at that length.

The claimed policy is the last version of a fine-tuning (`Matrix.versions` GRPO-shaped
AdamW steps at the run's learning rate from the published model), so that its 1, 2 and
10 versions older neighbours and its base exist; the validator holds the two versions
before it, as in a run (the version check)."""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from rollout_files import Maker, issued, make_judge
from verification_cheats import HeadStart, behaviours
from verification_setup import Log, Matrix, provenance, run_config, tuned_versions

from swarmrl.protocol.rollouts import read_rollouts, write_rollouts
from swarmrl.sim.registry import MULTI_TURN_CHEATS, make_cheat
from swarmrl.validator.checks import Reject, check_with_model

# `--quick` judges SmolLM2 (half a minute a file here) on these behaviours only, by dtype,
# without tokens-to-detect curves; the tiny model on every behaviour, with them
QUICK_SMOLLM2 = {"bfloat16": ("honest", "stale_1", "stale_2"), "float32": ("stale_1", "stale_2")}


def prefix_rejected(judge, ctx, rows: list[dict], policy: int) -> str:
    """The model check (7, 8 or the version check 9) that rejects these samples, or ""."""
    try:
        errors: list[float] = []
        behind: list = []
        check_with_model(ctx, judge.backend, rows, errors, behind)
        judge.check_versions(ctx, policy, rows, errors, behind)
        return ""
    except Reject as e:
        return e.check


def tokens_to_detect(
    judge, key: str, data: bytes, v, full: bool = False
) -> tuple[int | None, list]:
    """The completion tokens of the shortest leading run of the file's samples that the
    checks reject on their own, and the curve it was found on: [tokens read, samples
    read, rejected, the check that rejected] at 1, 2, 4, ... samples. `full`: the whole
    curve, rejected or not (an honest file's: its false rejections at each length)."""
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
        check = prefix_rejected(judge, ctx, rows[:k], policy)
        caught = bool(check)
        curve.append([sum(lengths[:k]), k, caught, check])
        if caught and need is None:
            need = sum(lengths[:k])
            if not full:
                return need, curve
        if k == len(rows):  # only the whole file's other checks caught it
            return (need or (None if v.accepted else sum(lengths))), curve
        k *= 2


def judged(
    judge, behaviour: str, key: str, data: bytes, model: str, dtype: str, curve: bool = True
) -> dict:
    """The record of one file judged at the defaults; `curve` False: without its tokens
    to detect."""
    v = judge.judge(key, data, issued=issued(key))
    need, points = (
        tokens_to_detect(judge, key, data, v, full=behaviour == "honest") if curve else (None, [])
    )
    tokens = sum(len(r["completion_tokens"]) for r in read_rollouts(data))
    return {"kind": "cheat", "model": model, "dtype": dtype, "behaviour": behaviour,
            "caught": not v.accepted, "check": v.check or "accepted", "reason": v.reason,
            "file_tokens": tokens, "tokens_to_detect": need, "curve": points, "stats": v.stats,
            **provenance()}  # fmt: skip


def first_counter(written: int, only: set | None) -> int:
    """Where a detection run's file counters start (a file's seeds and key derive from
    its counter): past every counter an earlier run on this log used (`written`: the
    model's detection files in the log, whatever rule judged them; a run uses fewer
    than 1,000 a file it writes, and 1,000 at most when it writes none), and, for runs
    side by side on other behaviours (`only`), in a range of their own."""
    lane = zlib.crc32(",".join(sorted(only)).encode()) % 100_000 if only else 0
    return 10**9 * lane + 1000 * (1 + written)


def _detection_in(
    m: Matrix,
    model: str,
    dtype: str,
    cheats: dict,
    dirs: dict,
    base: Path,
    files: int,
    log: Log,
    seen: dict,
    written: int,
    only: set | None,
) -> None:
    """The behaviours of `detection` against the version published in `dtype`, their
    files taken in turns (a run stopped early has files of every behaviour)."""
    v = m.versions
    quick_smollm2 = m.quick and model == "smollm2"
    older_dirs = [dirs[dtype][v - 2], dirs[dtype][v - 1]]
    cfg = run_config(base / f"run-{dtype}", dirs[dtype][v], model, "short", "single")
    judge = make_judge(cfg, base / f"run-{dtype}", older_dirs)
    maker = Maker(cfg, base / f"run-{dtype}", name="cheater")
    maker.counter = first_counter(written, only)
    maker.policy = len(older_dirs)

    def todo(name, dtype=dtype):
        if quick_smollm2 and name not in QUICK_SMOLLM2[dtype]:
            return 0
        if only is not None and name not in only:
            return 0
        return max(0, files - seen.get((model, dtype, name), 0))

    def add(name, key, data, dtype=dtype, judge=judge):
        log.add(judged(judge, name, key, data, model, dtype, curve=not quick_smollm2))

    # what makes each behaviour's next file; every file takes the next counter of the
    # one node
    makers: list = [("honest", lambda rep: maker.file())]  # the control, honest curve
    for name, cheat in cheats.items():

        def cheating(rep, cheat=cheat):
            if hasattr(cheat, "seed"):
                cheat.seed = rep
            return maker.file(cheat)

        makers.append((name, cheating))
    for name, k in m.older.items():
        smart_name = name.replace("stale", "head-start")
        if dtype == "float32" and not name.startswith("stale"):
            continue
        if name.startswith("stale") and todo(smart_name):  # the same, proved by the claimed
            smart = HeadStart(dirs[dtype][k], smart_name)
            makers.append((smart_name, lambda rep, smart=smart: maker.file(smart)))
        if not todo(name):
            continue
        other = run_config(base / f"run-{dtype}", dirs[dtype][k], model, "short", "single")
        liar = Maker(other, base / f"run-{dtype}", name="cheater")  # same node, same run
        liar.policy = maker.policy

        def lying(rep, liar=liar):
            liar.counter = maker.counter
            made = liar.file()
            maker.counter = liar.counter
            return made

        makers.append((name, lying))
    if dtype == "bfloat16":

        def replay(rep):  # an honest file passed off as a later assignment's
            _, first = maker.file(step=maker.policy + 1)
            key, _ = maker.file(step=maker.policy + 2)
            rows = [r | {"step": maker.policy + 2} for r in read_rollouts(first)]
            return key, write_rollouts(rows)

        makers.append(("replay", replay))
    left = {name: todo(name) for name, _ in makers}
    for rep in range(max(left.values(), default=0)):
        for name, make in makers:
            if rep < left[name]:
                add(name, *make(rep))


def detection(
    m: Matrix,
    model: str,
    files: int,
    work: Path,
    log: Log,
    seen: dict,
    written: int = 0,
    only: set | None = None,
) -> None:
    """The detection matrix of `model`: every behaviour (or those in `only`), `files`
    files each (minus those `seen` in the log already, by today's rule; `written`: all
    of the model's detection files in the log), against the fine-tuning's last
    version, published in bfloat16 (and in float32: the stale versions, and the bfloat16
    worker that claims float32). The validator holds the two versions before the claimed
    one (the version check)."""
    torch.set_num_threads(1)
    base = work / f"{model}-detect"
    dirs = tuned_versions(m, model, work)
    v = m.versions
    runs = [("bfloat16", behaviours("bfloat16")), ("float32", {})]
    runs[1][1]["bf16-claims-f32"] = behaviours("float32")["bf16-claims-f32"]
    for dtype, cheats in runs:
        _detection_in(m, model, dtype, cheats, dirs, base, files, log, seen, written, only)
    if model != "tiny":
        return
    # the environment's cheats, on the tiny model's tool trajectories
    older_dirs = [dirs["bfloat16"][v - 2], dirs["bfloat16"][v - 1]]
    cfg = run_config(base / "run-tools", dirs["bfloat16"][v], model, "short", "tools")
    judge = make_judge(cfg, base / "run-tools", older_dirs)
    maker = Maker(cfg, base / "run-tools", name="cheater")
    maker.counter = first_counter(written, only)
    maker.policy = len(older_dirs)
    # loose-tool-limits needs tools with limits (the calculator, the Python tool), which
    # the tiny model never calls: tests/unit/test_multiturn.py catches it on one
    for name in [n for n in MULTI_TURN_CHEATS if n != "loose-tool-limits"]:
        if only is not None and name not in only:
            continue
        for rep in range(max(0, files - seen.get((model, "bfloat16", name), 0))):
            data = maker.file(make_cheat(name, seed=rep))
            log.add(judged(judge, name, *data, model, "bfloat16"))


def policy_distance(m: Matrix, model: str, work: Path, log: Log) -> None:
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
    dirs = tuned_versions(m, model, work)["float32"]
    v = m.versions
    cfg = run_config(work / f"{model}-distance", dirs[v], model, "short", "single")
    rows = read_rollouts(Maker(cfg, work / f"{model}-distance", name="distance").file()[1])
    engines = {}
    for name, path in (("policy", dirs[v]), ("one_step", dirs[v - 1]),
                       ("noise-0.001", dirs[v])):  # fmt: skip
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
