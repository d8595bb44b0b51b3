"""What the verification bench's two halves share (bench/verification_rates.py: honest
rates; bench/verification_detection.py: the detection matrix): the models and their
file shapes, the versions files claim, the results log and each record's provenance."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rollout_files import Maker, small_run
from trajectory_envs import Echo
from verification_cheats import fine_tuned_versions, save_version

from swarmrl.envs import environment as environment_module
from swarmrl.models.loading import load_model
from swarmrl.protocol.rollouts import read_rollouts
from swarmrl.validator.frozen import draws_fingerprint, tolerance_fingerprint

ROOT = Path(__file__).resolve().parent.parent
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
TRAINING = {"tiny": (2.5e-4, 2), "smollm2": (1e-5, 1)}  # configs' lr, optimizer steps


@dataclass
class Matrix:
    """One invocation's settings: the fine-tuning whose last version files claim
    (`versions` GRPO-shaped steps from the published model), whether it is `--quick`,
    and the real runs' weights directories (`--run-versions`, model -> directory)."""

    versions: int = 12
    quick: bool = False
    run_versions: dict[str, Path] = field(default_factory=dict)

    @property
    def kept(self) -> list[int]:
        """The fine-tuning's versions saved: the base, the claimed one, the two before
        it, and (in a fine-tuning of ten or more) the one ten versions older."""
        v = self.versions
        return sorted({0, v - 2, v - 1, v} | ({v - 10} if v >= 10 else set()))

    @property
    def older(self) -> dict[str, int]:
        """The stale behaviours: a worker that generates with an older version than the
        one it claims, by name, and the version it generates with."""
        v = self.versions
        out = {"stale_1": v - 1, "stale_2": v - 2}
        if v >= 10:
            out["older-10"] = v - 10
        return out | {"base": 0}


def _commit() -> str:
    """The commit this process's code came from, read once (a commit made while a long
    run goes on is not the code it runs), with `-dirty` where the package or the bench
    differed from it (such records count nowhere out of sample)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--", "swarmrl", "bench") else "")


COMMIT = _commit()


def provenance() -> dict:
    """What every record carries: the commit it was judged at, the fingerprints of the
    tolerances that judged it (only records under a frozen fingerprint count out of
    sample: bench/verification_report.py) and when."""
    return {"commit": COMMIT, "fingerprint": tolerance_fingerprint(),
            "draws_fingerprint": draws_fingerprint(), "at": round(time.time(), 1)}  # fmt: skip


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


def tuned_versions(m: Matrix, model: str, work: Path) -> dict[str, dict[int, Path]]:
    """The fine-tuning of `model` the detection matrix and the honest `tuned` conditions
    share: dtype -> version -> directory, for the versions `m.kept` (made once per work
    directory)."""
    base = work / f"{model}-detect"
    dirs = {}
    for dtype in ("bfloat16", "float32"):
        if all((base / dtype / f"v{k}" / "config.json").exists() for k in m.kept):
            dirs[dtype] = {k: base / dtype / f"v{k}" for k in m.kept}
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
            SOURCES[model], rows, ["bfloat16", "float32"], base, m.kept, lr, inner
        )
    finally:
        torch.set_num_threads(threads)


def run_versions(m: Matrix, model: str, dtype: str, work: Path) -> list[Path] | None:
    """The last three versions a real run of `model` published (its weights directory's
    step_<n>/, float32 on a CPU trainer), oldest first, in `dtype`: a bfloat16 copy is
    rounded to nearest from the float32 version, as a trainer that publishes bfloat16
    writes it. None when no run was given for the model."""
    root = m.run_versions.get(model)
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


def claimed(m: Matrix, c: dict, work: Path) -> tuple[Path, list[Path]]:
    """The version a condition's files claim, and the versions before it that its
    validator holds (oldest first): the published model alone (`base`), or (`tuned`)
    the last version of a real run (`--run-versions`) with the two before it, else
    the claimed version of the bench's own fine-tuning with the two before it."""
    if c.get("version", "base") == "base":
        return Versions(work).published(c["model"], c["dtype"]), []
    run = run_versions(m, c["model"], c["dtype"], work)
    if run is not None:
        return run[-1], run[:-1]
    dirs = tuned_versions(m, c["model"], work)[c["dtype"]]
    v = m.versions
    return dirs[v], [dirs[v - 2], dirs[v - 1]]
