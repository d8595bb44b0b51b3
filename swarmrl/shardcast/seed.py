"""Version 0 from the base model a node already holds, in place of downloading it.

The trainer publishes version 0 as the base model (`model.path`) loaded in
`model.dtype`, cast to its publish dtype and saved as HF files. A worker that holds
the same base (a volunteer who pulled the model before joining, or any node on the
trainer's machine) writes the same files with `write_base_version`, and the
follower takes each one whose size and sha256 are the signed manifest's
(`take_seeded`) instead of fetching it: on a 10 Mbit/s link SmolLM2's 655 MB is
nine minutes saved. Nothing unsigned is trusted: a file whose hash differs (another
transformers release, another publish dtype: a GPU trainer publishes bfloat16) is
fetched as before, and `LocalWeights.open_verified` re-checks every file before it
is loaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

from swarmrl.protocol.manifest import FileEntry, Manifest

log = logging.getLogger("swarmrl.shardcast.seed")

READ = 8 << 20
# how long a follower waits for the files of a node still loading its base before it
# fetches version 0 (a quarter of a core took 140 s to load SmolLM2 and write them)
SEED_WAIT_S = 300.0


def expect_seed(weights) -> None:
    """Before the base is loaded: tell `weights`' follower that version 0's files are
    being made here, so that it waits for them (at most SEED_WAIT_S) instead of
    fetching version 0 meanwhile. `seed_version_0` ends the wait, with files or without."""
    follower = getattr(weights, "follower", None)
    if follower is not None and weights.newest() is None:
        follower.seeds.setdefault(0, None)


def drop_seed(weights) -> None:
    """No files are coming (the base could not be loaded): the follower waits no more."""
    follower = getattr(weights, "follower", None)
    if follower is not None and 0 in follower.seeds and follower.seeds[0] is None:
        follower.seeds.pop(0, None)


def write_base_version(model, tokenizer, d: Path, dtype) -> None:
    """Write into `d` the files the trainer publishes as version 0 from `model` (the base
    loaded in `model.dtype`): floating tensors cast to `dtype` (a torch dtype) on the
    CPU, `save_pretrained`, the tokenizer's files and the config naming `dtype`
    (trainer/ranks.py `start`, trainer/loop.py `_publish`)."""
    from swarmrl.models.loading import set_config_dtype

    state = {
        k: v.detach().to("cpu", dtype=dtype if v.is_floating_point() else v.dtype, copy=True)
        for k, v in model.state_dict().items()
    }
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(d)
    set_config_dtype(d, str(dtype).removeprefix("torch."))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ):
            h.update(chunk)
    return h.hexdigest()


async def seed_for(seeds: dict, version: int) -> Path | None:
    """The directory of `version`'s files made on this node (a follower's `seeds`), once
    they are written if they are being written (at most SEED_WAIT_S); None without one."""
    import asyncio

    deadline = time.monotonic() + SEED_WAIT_S
    while seeds.get(version, 0) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return seeds.pop(version, None)


def take_seeded(
    manifest: Manifest, seed: Path, d: Path, wanted: list[FileEntry]
) -> tuple[list[FileEntry], int]:
    """Move into staging directory `d` each file of `wanted` that `seed` holds with the
    manifest's size and sha256; the files still to fetch and the bytes taken. The
    seed directory is removed afterwards (what matched was moved, what did not is of
    no further use)."""
    rest, taken = [], 0
    for fe in wanted:
        src = seed / fe.name
        try:
            ok = src.is_file() and src.stat().st_size == fe.size and sha256_file(src) == fe.sha256
        except OSError as e:  # recovered: the file is fetched instead
            log.warning("version %d: seed file %s unreadable (%s)", manifest.version, src, e)
            ok = False
        if not ok:
            rest.append(fe)
            continue
        dst = d / fe.name
        try:
            os.replace(src, dst)
        except OSError:  # another filesystem: copied
            shutil.copyfile(src, dst)
        taken += fe.size
    shutil.rmtree(seed, ignore_errors=True)
    return rest, taken


def seed_version_0(cfg, weights, backend, tokenizer) -> None:
    """Before version 0 is here: write its files from the base a worker just loaded into
    `backend` (or loads here where the engine holds it in another dtype or is no torch
    module) for `weights`' follower to take. The files are written in
    `model.publish_dtype`, or where that is auto in `model.dtype` (a CPU trainer's; a
    GPU trainer publishes bfloat16, whose files then do not match and are fetched)."""
    try:
        _seed_version_0(cfg, weights, backend, tokenizer)
    finally:
        drop_seed(weights)


def _seed_version_0(cfg, weights, backend, tokenizer) -> None:
    follower = getattr(weights, "follower", None)
    if follower is None or weights.newest() is not None:
        return
    import torch

    from swarmrl.models.loading import load_model

    mc = cfg.model
    dtype = getattr(torch, mc.dtype if mc.publish_dtype == "auto" else mc.publish_dtype)
    t0 = time.time()
    model = getattr(backend, "model", None)
    loaded = getattr(torch, mc.dtype)
    if not isinstance(model, torch.nn.Module) or next(model.parameters()).dtype != loaded:
        model = load_model(mc.path, mc.dtype)
    d = follower.local.root.parent / "seed-0"
    shutil.rmtree(d, ignore_errors=True)
    try:
        write_base_version(model, tokenizer, d, dtype)
    except OSError as e:  # recovered: version 0 is downloaded instead
        log.warning("version 0 not written from the base (%s); it will be downloaded", e)
        shutil.rmtree(d, ignore_errors=True)
        return
    if 0 in follower.local.versions():  # fetched meanwhile (the wait ran out)
        shutil.rmtree(d, ignore_errors=True)
        return
    follower.seeds[0] = d
    log.info("wrote version 0's files from the base in %.2fs (taken where their hashes are "
             "the signed manifest's)", time.time() - t0)  # fmt: skip
