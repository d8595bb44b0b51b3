"""Version 0 from the base a node holds (shardcast/seed.py): the files a worker writes
from its loaded base are the trainer's version 0 byte for byte, and a follower takes
the seeded files whose hashes the signed manifest gives and fetches the rest."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from swarmrl.config import load_config
from swarmrl.inference.engine import make_engine
from swarmrl.models.loading import load_tokenizer
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.manifest import verify_version
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.seed import drop_seed, expect_seed, seed_version_0
from swarmrl.trainer import loop
from swarmrl.trainer.ranks import Policy
from tests.unit.shardcast_util import make_origin, publish, until


def _digests(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


class _Publisher:
    """The trainer's publisher, writing at once into one directory."""

    def __init__(self, d: Path):
        self.d = d

    def submit(self, version, write, done) -> None:
        self.d.mkdir(parents=True)
        write(self.d)


def _follow(tmp_path, key, versions: int, seed_files):
    """An origin holding versions 0 to `versions` - 1 (`publish`), and a follower whose
    version 0 is seeded with `seed_files(version 0's model bytes)` (name -> bytes), run
    until it installs a version: the follower, what it fetched, version 0's model bytes
    and the seed directory."""
    w, origin = make_origin(tmp_path, key)
    data = [publish(w, v) for v in range(versions)]
    url = origin.start()
    seed = tmp_path / "seed-0"
    seed.mkdir()
    for name, content in seed_files(data[0]).items():
        (seed / name).write_bytes(content)

    async def main():
        stop = asyncio.Event()
        got = []
        f = Follower([url], public_key_hex(key), tmp_path / "client", on_fetched=got.append)
        f.seeds[0] = seed
        task = asyncio.create_task(f.run(stop))
        await until(lambda: got)
        stop.set()
        await task
        return f, got

    try:
        f, got = asyncio.run(main())
    finally:
        origin.stop()
    return f, got, data[0], seed


@pytest.mark.parametrize(
    "overrides",
    [[], ["model.publish_dtype=bfloat16"], ["trainer.lora.rank=4"]],
    ids=["float32", "bfloat16", "lora"],
)
def test_the_worker_writes_the_trainers_version_0_byte_for_byte(tmp_path, tiny_dir, overrides):
    cfg = load_config(
        None,
        [f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
         f"model.path={json.dumps(str(tiny_dir))}", "trainer.kl_coef=0.0", *overrides],
    )  # fmt: skip
    policy = Policy(cfg, 0, 1)
    first = policy.start(str(tiny_dir))
    trainer_v0 = tmp_path / "trainer-v0"
    tokenizer = load_tokenizer(cfg.model.path)
    loop._publish(_Publisher(trainer_v0), policy.model, first, tokenizer, 0, lambda v: None)

    backend = make_engine(cfg, torch.device("cpu"), name="hf")  # as start_early loads it
    backend.load(Path(cfg.model.path))
    local = SimpleNamespace(root=tmp_path / "node" / "weights", versions=list)
    follower = SimpleNamespace(local=local, seeds={})
    weights = SimpleNamespace(follower=follower, newest=lambda: None)
    seed_version_0(cfg, weights, backend, tokenizer)
    assert _digests(follower.seeds[0]) == _digests(trainer_v0)
    # a version is already here: nothing is written
    again = SimpleNamespace(follower=SimpleNamespace(seeds={}), newest=lambda: 0)
    seed_version_0(cfg, again, backend, tokenizer)
    assert again.follower.seeds == {}


def test_a_follower_takes_the_seeded_files_that_match_and_fetches_the_rest(tmp_path, key):
    f, got, data0, seed = _follow(
        tmp_path, key, 1,
        lambda data0: {
            "model.safetensors": data0,  # the bytes the manifest signs
            "config.json": json.dumps({"v": 1}).encode(),  # not version 0's
        },
    )  # fmt: skip
    verify_version(f.local.path(0), public_key_hex(key))
    assert (f.local.path(0) / "model.safetensors").read_bytes() == data0
    assert json.loads((f.local.path(0) / "config.json").read_text()) == {"v": 0}
    assert got[0].bytes == len('{"v": 0}')  # only the file that did not match came over
    assert not seed.exists() and f.seeds == {}


def test_a_seed_with_forged_bytes_is_not_taken(tmp_path, key):
    def forged(data0: bytes) -> dict:
        one_bit_off = bytearray(data0)  # the right size, one bit off
        one_bit_off[12345] ^= 1
        return {"model.safetensors": bytes(one_bit_off)}

    f, got, data0, _ = _follow(tmp_path, key, 1, forged)
    assert (f.local.path(0) / "model.safetensors").read_bytes() == data0
    assert got[0].bytes == len(data0) + len('{"v": 0}')


def test_a_late_joiners_seed_is_dropped_once_a_newer_version_is_in(tmp_path, key):
    f, got, _, seed = _follow(tmp_path, key, 2, lambda _: {"model.safetensors": b"base"})
    assert [g.version for g in got] == [1] and f.local.versions() == [1]
    assert f.seeds == {} and not seed.exists()


def test_a_follower_waits_for_files_still_being_made(tmp_path, key):
    """A node loading its base marks version 0's files as coming (`expect_seed`): the
    follower waits for them instead of downloading the version meanwhile, then takes
    them; where none come (`drop_seed`), it fetches the version at once."""
    w, origin = make_origin(tmp_path, key)
    data0 = publish(w, 0)
    url = origin.start()
    pub = public_key_hex(key)

    async def follow(make_seed):
        stop = asyncio.Event()
        got = []
        f = Follower([url], pub, tmp_path / f"client-{make_seed}", on_fetched=got.append)
        weights = SimpleNamespace(follower=f, newest=f.local.newest)
        expect_seed(weights)
        task = asyncio.create_task(f.run(stop))
        await asyncio.sleep(1.0)  # the manifest is there long before this
        assert not got and f.local.versions() == []
        if make_seed:
            seed = tmp_path / "seed-0"
            seed.mkdir()
            (seed / "model.safetensors").write_bytes(data0)
            f.seeds[0] = seed
        else:
            drop_seed(weights)
        await until(lambda: got)
        stop.set()
        await task
        return got[0]

    try:
        seeded = asyncio.run(follow(True))
        fetched = asyncio.run(follow(False))
    finally:
        origin.stop()
    assert seeded.bytes == len('{"v": 0}')
    assert fetched.bytes == len(data0) + len('{"v": 0}')
