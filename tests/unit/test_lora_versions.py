"""Adapter-only versions (trainer.lora): the trainer publishes version 0 whole and the
adapter alone after it, signed with the base's hashes; a node that joins late fetches
the base too; every node runs base + adapter merged, which computes what the trainer's
adapted model computes; retention keeps the base; a base that is not the one named
is refused; a resume continues the adapters."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch

from swarmrl.config import ConfigError, load_config
from swarmrl.models.loading import load_model
from swarmrl.protocol.identity import public_key_hex
from swarmrl.protocol.manifest import ManifestError, read_manifest, version_files
from swarmrl.shardcast.adapter import ADAPTER_CONFIG, ADAPTER_FILE, model_dir
from swarmrl.shardcast.client import Follower
from swarmrl.shardcast.local import LocalWeights
from swarmrl.shardcast.origin import Origin
from swarmrl.trainer import lora
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.ranks import Policy
from tests.unit.shardcast_util import SHARD, start_relays, until


def _cfg(tmp_path, model_dir_, *overrides):
    return load_config(
        None,
        [
            f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            f"model.path={json.dumps(str(model_dir_))}",
            "worker.group_size=2",
            "trainer.batch_groups=2",
            "trainer.kl_coef=0.0",
            "trainer.lora.rank=4",
            "trainer.lora.alpha=8",
            "trainer.lr=0.01",
            *overrides,
        ],
    )


def _samples(seed: int):
    rng = random.Random(seed)
    return [
        Sample([rng.randrange(4, 90) for _ in range(6)], [rng.randrange(4, 90) for _ in range(5)],
               rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0)
        for _ in range(4)
    ]  # fmt: skip


def _publish(weights: LocalWeights, policy: Policy, version: int, state: dict, tokenizer=None):
    d = weights.staging_dir(version)
    lora.save_version(policy.model, d, state)
    if tokenizer is not None:
        tokenizer.save_pretrained(d)
    return weights.publish(version)


def _trained(tmp_path, random_model_dir, key, steps=3, keep=2, *overrides):
    """A LoRA policy trained `steps` steps, each version published to an origin's weights."""
    from swarmrl.models.loading import load_tokenizer

    cfg = _cfg(tmp_path, random_model_dir, *overrides)
    policy = Policy(cfg, 0, 1)
    first = policy.start(str(random_model_dir))
    weights = LocalWeights(tmp_path / "origin", keep=keep, key=key, shard_bytes=SHARD,
                           trusted_key=public_key_hex(key), adapter_base=0)  # fmt: skip
    _publish(weights, policy, 0, first, load_tokenizer(str(random_model_dir)))
    for step in range(1, steps + 1):
        policy.step(step, _samples(step))
        _publish(weights, policy, step, policy.snapshot())
    return cfg, policy, weights


def test_versions_after_the_first_are_the_signed_adapter_and_run_merged(
    tmp_path, random_model_dir, key
):
    cfg, policy, weights = _trained(tmp_path, random_model_dir, key)
    pub = public_key_hex(key)
    zero = read_manifest(weights.path(0))
    assert zero.base is None and (weights.path(0) / "config.json").exists()
    for v in (2, 3):
        m = read_manifest(weights.path(v))
        m.check_signature(pub)
        assert m.base.version == 0 and m.base.files == {f.name: f.sha256 for f in zero.files}
        assert {p.name for p in version_files(weights.path(v))} == {ADAPTER_FILE, ADAPTER_CONFIG}
        assert m.total_bytes() * 4 < zero.total_bytes(), (m.total_bytes(), zero.total_bytes())
    # retention keeps the newest two and the base they adapt
    assert weights.versions() == [0, 2, 3]

    merged = model_dir(weights, 3)
    plain = load_model(str(merged))
    want = lora.merged_state(policy.model)
    got = plain.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-6), k
    assert any(not torch.equal(got[k], load_model(str(random_model_dir)).state_dict()[k])
               for k in got)  # fmt: skip
    ids = torch.randint(4, 90, (2, 10))
    with torch.no_grad():
        ours, theirs = policy.model(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    assert model_dir(weights, 3) == merged  # merged once per process and version


def test_a_base_that_is_not_the_one_named_is_refused(tmp_path, random_model_dir, key):
    _, _, weights = _trained(tmp_path, random_model_dir, key, steps=1)
    base = weights.path(0)
    data = bytearray((base / "model.safetensors").read_bytes())
    data[-1] ^= 1  # another base under the same version number, signed as its own
    weights.delete(0)
    d = weights.staging_dir(0)
    (d / "model.safetensors").write_bytes(bytes(data))
    weights.publish(0)
    with pytest.raises(ManifestError, match="other files"):
        model_dir(weights, 1)


def test_a_node_that_joins_late_fetches_the_base_through_a_relay(tmp_path, random_model_dir, key):
    _, policy, weights = _trained(tmp_path, random_model_dir, key, steps=3)
    pub = public_key_hex(key)
    origin = Origin(weights)
    url = origin.start()

    async def main():
        stop = asyncio.Event()
        relays = await start_relays([url], pub, tmp_path, stop, n=1)
        follower = Follower(relays, pub, tmp_path / "worker", keep=1)
        task = asyncio.create_task(follower.run(stop))
        await until(lambda: 3 in follower.local.versions())
        stop.set()
        await task
        return follower

    try:
        follower = asyncio.run(main())
    finally:
        origin.stop()
    # it skipped to the newest version and took the base it names; retention keeps both
    assert follower.local.versions() == [0, 3]
    merged = load_model(str(model_dir(follower.local, 3)))
    want = lora.merged_state(policy.model)
    assert all(torch.allclose(merged.state_dict()[k], want[k], atol=1e-6) for k in want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_resume_continues_the_adapters(tmp_path, random_model_dir, key, dtype):
    """The adapters come back exactly: from the version (float32), or from the optimizer
    checkpoint's masters (bfloat16 versions), which hold the adapters alone."""
    import torch.distributed.checkpoint as dcp

    over = f"model.publish_dtype={dtype}"
    cfg, policy, weights = _trained(tmp_path, random_model_dir, key, 2, 2, over)
    optim = policy.save(cfg.paths, 2)
    saved = dcp.FileSystemReader(str(optim)).read_metadata().state_dict_metadata
    masters = {k for k in saved if k.startswith("model.")}
    assert all(".lora_" in k for k in masters) and (dtype == "bfloat16") == bool(masters)
    again = Policy(cfg, 0, 1)
    again.start(str(weights.path(2)), str(optim))
    before = policy.model.state_dict()
    for k, v in again.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    state = again.optimizer.state_dict()["state"]
    assert state and len(state) == len(lora.trainable(again.model))


def test_adapters_are_refused_where_the_swarm_does_not_train_them(tmp_path, random_model_dir):
    lora.check_swarm(_cfg(tmp_path, random_model_dir))
    lora.check_swarm(load_config(None, ["trainer.ranks=2"]))  # no adapters: not our business
    for bad in ("trainer.ranks=2", "trainer.kl_coef=0.05", "trainer.diloco.sites=2"):
        with pytest.raises(ConfigError, match="one trainer rank, no DiLoCo sites"):
            lora.check_swarm(_cfg(tmp_path, random_model_dir, bad))
