"""Rollout files as honest and cheating workers write them, and a judge of them: shared by
the validator tests and bench/toploc.py."""

from __future__ import annotations

import json
from pathlib import Path

from swarmrl.config import load_config
from swarmrl.inference.hf import HFBackend
from swarmrl.inference.worker import build_rows
from swarmrl.models.loading import load_tokenizer
from swarmrl.protocol.assign import Assignment, rollout_key
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.rollouts import write_rollouts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.protocol.seeds import derive_seed
from swarmrl.sim.cheats import Cheat
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.validator.loop import Judge


class FixedWeights:
    """The weights seam with one version (0): the model directory; or, with `older` (the
    versions before it, oldest first), those as 0, 1, ... and the model directory last."""

    def __init__(self, path: Path, older: list[Path] = ()):
        self.versions = [*map(Path, older), Path(path)]

    def newest(self) -> int:
        return len(self.versions) - 1

    def open_verified(self, version: int) -> Path:
        if not 0 <= version < len(self.versions):
            raise FileNotFoundError(version)
        return self.versions[version]


def small_run(tmp: Path, model: Path, *overrides: str):
    """A run config for files of a few groups with two proof chunks per long completion."""
    return load_config(
        None,
        [
            f"runs_dir={json.dumps(str(tmp / 'runs'))}",
            f"model.path={json.dumps(str(model))}",
            "worker.group_size=4",
            "worker.groups_per_file=3",
            "sampling.max_new_tokens=40",
            "task.min_len=3",
            "task.max_len=20",
            *overrides,
        ],
    )


ISSUED: dict[str, dict] = {}  # file key -> its assignment, as the orchestrator issues it


def issued(key: str) -> dict | None:
    """The assignment of a file a Maker wrote, as a validator is handed it with the
    file; None for a key no assignment was issued under."""
    return ISSUED.get(key)


class Maker:
    """Writes rollout files as a worker node would, honest or with a cheat. `state` is
    the sampler state issued for every step; each file's assignment is recorded for
    `issued(key)`, as the orchestrator records it for validators."""

    def __init__(
        self, cfg, tmp: Path, name: str = "node", max_batch: int = 256, state=None, backend=None
    ):
        self.cfg = cfg
        self.state = state or SamplerState()
        self.node = public_key_hex(load_or_create_key(tmp / "keys" / f"{name}.key"))
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.source = TaskSource(cfg.task, cfg.seed)
        self.backend = backend or HFBackend(max_batch=max_batch)
        self.backend.load(Path(cfg.model.path))
        self.counter = 0
        self.policy = 0  # the version its files claim

    def file(self, cheat: Cheat | None = None, step: int | None = None) -> tuple[str, bytes]:
        """The key and bytes of the next file, honest or made by `cheat` (its
        `after_load` applied to the model first, as a worker would after a load), for
        `step` (default: the one after its policy version)."""
        step = self.policy + 1 if step is None else step
        self.counter += 1
        seed = derive_seed(self.cfg.seed, self.node, step, self.counter)
        a = Assignment(
            step=step, policy_step=self.policy, seed=seed, counter=self.counter,
            sampler=self.state,
        )  # fmt: skip
        if cheat is None:
            rows = build_rows(self.cfg, self.tokenizer, self.source, self.backend, a, self.node)
        else:
            cheat.after_load(self.backend)
            rows = cheat.rows(self.cfg, self.tokenizer, self.source, self.backend, a, self.node)
        key = rollout_key(a, self.node, self.cfg.worker.groups_per_file)
        ISSUED[key] = {
            "step": step, "policy_step": self.policy, "counter": self.counter, "seed": seed,
            "max_new_tokens": self.cfg.sampling.max_new_tokens, "sampler": self.state.to_json(),
        }  # fmt: skip
        data = write_rollouts(rows)
        if cheat is not None:
            self.backend.load(Path(self.cfg.model.path))  # undo what the cheat did to the model
        return key, data


def make_judge(cfg, tmp: Path, older: list[Path] = ()) -> Judge:
    """A validator's judge of files that claim the model of `cfg` as their policy: as
    version 0, or with `older` (the versions before it, oldest first, for the version
    check) as version len(older)."""
    backend = HFBackend()
    backend.load(Path(cfg.model.path))
    key = load_or_create_key(tmp / "keys" / "validator-0.key")
    weights = FixedWeights(Path(cfg.model.path), older)
    judge = Judge(cfg, backend, weights, key, HFBackend)
    judge.loaded = weights.newest()  # the backend holds it (a .gguf cannot be hot-swapped)
    judge.set_tolerances()  # as ensure_policy does after a load
    return judge
