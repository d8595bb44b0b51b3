"""Room on disk for a local swarm, checked before anything starts.

Every process of a local swarm keeps its own copies of the policy's versions
(docs/reference/run-directory.md): the trainer the newest `async_level + 1` and
`final/`, each relay `async_level + 1`, each validator `async_level + 2`, each
worker `shardcast.keep_local`; the trainer keeps `async_level + 1` states, each
with AdamW's two moments (and the master weights when versions are published in
a lower precision). A SmolLM2-135M run takes about 12 GB. With adapter versions
(`trainer.lora`) every holder keeps one whole version (0) and each node its merged
copies (shardcast/adapter.py). A disk that fills up
mid-run kills processes half-way through a write; `launch` refuses to start
instead, naming the figures.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from swarmrl.config.run import RunConfig
from swarmrl.errors import LaunchError
from swarmrl.shardcast.adapter import KEEP_MERGED

HEADROOM = 1.2  # a version being downloaded beside those kept, patches, rollouts, logs


@dataclass(frozen=True)
class DiskNeed:
    version_bytes: int  # one published version
    versions: int  # copies of a version held across the swarm at once
    state_bytes: int  # the trainer's state, two of them while the newest is written

    @property
    def total(self) -> int:
        return int((self.version_bytes * self.versions + self.state_bytes) * HEADROOM)


def model_elements(path: str) -> int:
    """Elements of the model's state dict, counted on the meta device from the
    model's config: nothing is loaded. A tied tensor counts under each of its names,
    as a published version holds it (SmolLM2's versions are 651 MB in float32, its
    134.5 million parameters 538 MB)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from swarmrl.models.loading import converted_dir, quiet_transformers

    quiet_transformers()
    config = AutoConfig.from_pretrained(str(converted_dir(path)))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(t.numel() for t in model.state_dict().values())


def disk_need(
    cfg: RunConfig,
    elements: int,
    relays: int,
    validators: int,
    workers: int,
    published_dtype: torch.dtype | None = None,
) -> DiskNeed:
    """What a swarm of that many relays, validators and workers (cheaters included)
    beside its trainer needs on disk, for a model of `elements` published in
    `published_dtype` (default: what a CPU trainer publishes). Without SHARDCAST the
    other processes read the trainer's own versions and keep none."""
    master = getattr(torch, cfg.model.dtype).itemsize
    if published_dtype is None:
        name = cfg.model.publish_dtype
        published_dtype = getattr(torch, cfg.model.dtype if name == "auto" else name)
    published = published_dtype.itemsize
    held = cfg.async_level + 1
    if cfg.trainer.lora.rank:
        # adapter versions: version 0 is the one whole copy a holder keeps (the adapters
        # and their optimizer state are a few MB, under the headroom); a node runs each
        # adapter merged into it, keeping KEEP_MERGED merged directories of its own
        versions = 2  # the trainer's version 0 and final/
        nodes = validators + workers
        if cfg.shardcast.enabled:
            versions += relays + nodes * (1 + KEEP_MERGED)
        else:
            versions += nodes * KEEP_MERGED
        return DiskNeed(version_bytes=elements * published, versions=versions, state_bytes=0)
    versions = held + 1  # the trainer's weights/ and final/
    if cfg.shardcast.enabled:
        versions += relays * held + validators * (held + 1) + workers * cfg.shardcast.keep_local
    per_state = elements * master * 2 + (elements * master if published < master else 0)
    return DiskNeed(
        version_bytes=elements * published, versions=versions, state_bytes=held * per_state
    )


def _run_files(run: Path) -> int:
    """Bytes of the versions and trainer states a resumed run already holds."""
    total = 0
    for part in ("weights", "final", "trainer_state", "relays", "nodes"):
        for f in (run / part).rglob("*"):
            try:
                total += f.stat().st_size if f.is_file() else 0
            except FileNotFoundError:  # pruned while we looked
                pass
    return total


def check_disk(cfg: RunConfig, relays: int, validators: int, workers: int) -> DiskNeed:
    """Refuse to start when the run directory's filesystem has less free space than
    the swarm needs (LaunchError, with the figures and what lowers them)."""
    from swarmrl.device import resolve_device
    from swarmrl.trainer.ranks import publish_dtype

    dtype = publish_dtype(cfg, resolve_device(cfg.trainer.device, "trainer.device"))
    need = disk_need(cfg, model_elements(cfg.model.path), relays, validators, workers, dtype)
    where = Path(cfg.run_dir)
    while not where.exists():
        where = where.parent
    # a resumed run's own versions and states are part of what it needs, not taken from the room
    free = shutil.disk_usage(where).free + _run_files(Path(cfg.run_dir))
    if free < need.total:
        gb = 1 << 30
        raise LaunchError(
            f"not enough disk for this swarm under {where}: {free / gb:.1f} GiB free (this run's "
            f"files included), about "
            f"{need.total / gb:.1f} GiB needed ({need.versions} copies of a "
            f"{need.version_bytes / gb:.2f} GiB policy version across the trainer, "
            f"{relays} relays, {validators} validators and {workers} workers, and "
            f"{need.state_bytes / gb:.1f} GiB of trainer state). Free some space, set "
            "runs_dir to a larger disk, or run fewer workers, validators or relays, or a "
            "lower async_level or shardcast.keep_local"
        )
    return need
