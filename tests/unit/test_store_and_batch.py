import pytest

from swarmrl.inference.rollouts import Limits, write_rollouts
from swarmrl.protocol.assign import Assignment, LocalAssigner, parse_rollout_key, rollout_key
from swarmrl.protocol.store import LocalDirStore
from swarmrl.shardcast.manifest import write_json_atomic
from swarmrl.trainer.batch import Batch, BatchCollector, consumed_key, restore_unpublished
from tests.unit.test_rollouts import make_rows


def test_store_put_get_list_delete_and_key_checks(tmp_path):
    s = LocalDirStore(tmp_path)
    s.put("rollouts/step_000001/a.parquet", b"x")
    s.put("rollouts/step_000002/b.parquet", b"y")
    assert s.list("rollouts") == [
        "rollouts/step_000001/a.parquet",
        "rollouts/step_000002/b.parquet",
    ]
    assert s.get("rollouts/step_000002/b.parquet") == b"y"
    s.delete("rollouts/step_000001/a.parquet")
    assert s.list("rollouts") == ["rollouts/step_000002/b.parquet"]
    for bad in ("../etc/passwd", "/abs", "a/../b", "a//b", ""):
        with pytest.raises(ValueError, match="invalid store key"):
            s.put(bad, b"z")


def test_rollout_keys_round_trip():
    key = rollout_key(Assignment(step=7, policy_step=5, seed=1, counter=3), "ab12", 8)
    assert parse_rollout_key(key) == {
        "step": 7,
        "node": "ab12",
        "counter": 3,
        "policy": 5,
        "groups": 8,
    }
    assert parse_rollout_key("rollouts/step_1/../../x.parquet") is None
    # one spelling per assignment: other zero padding is not the same file
    assert parse_rollout_key(key.replace("step_000007", "step_7")) is None
    assert parse_rollout_key(key.replace("-3-", "-03-")) is None


def test_listing_skips_names_the_store_would_refuse(tmp_path):
    s = LocalDirStore(tmp_path)
    s.put("rollouts/a.parquet", b"x")
    (tmp_path / "rollouts" / "a b.parquet").write_bytes(b"y")  # written around the store
    assert s.list("rollouts") == ["rollouts/a.parquet"]


def _put(store, step, policy, rows, counter):
    a = Assignment(step=step, policy_step=policy, seed=0, counter=counter)
    key = rollout_key(a, "ab" * 16, 2)
    store.put(key, rows if isinstance(rows, bytes) else write_rollouts(rows))
    return key


def test_collector_filters_stale_corrupt_and_zero_advantage(tmp_path):
    store = LocalDirStore(tmp_path)
    good = make_rows(groups=2, g=3, step=5, policy=4)
    flat = make_rows(groups=2, g=3, step=5, policy=4)
    for r in flat:
        r["reward"] = 1.0  # both groups have equal rewards: no signal
    k_stale = _put(store, 5, 2, make_rows(step=5, policy=2), 1)
    k_bad = _put(store, 5, 4, b"not parquet at all", 2)
    _put(store, 5, 4, flat, 3)
    k_good = _put(store, 5, 4, good, 4)
    c = BatchCollector(store, Limits(group_size=3), async_level=2, poll_s=0.01)
    batch = c.collect(step=5, need_groups=2)
    assert batch.groups == 2 and len(batch.samples) == 6
    assert batch.stale_files == 1 and batch.rejected_files == 1 and batch.dropped_groups == 2
    assert batch.accepted_files == 2
    assert consumed_key(k_good) in batch.consumed and store.list("rollouts") == []
    assert k_stale not in store.list("consumed")
    reason = store.get("rejected/" + k_bad.replace("/", "__") + ".reason.txt").decode()
    assert "not a readable parquet" in reason
    # advantages were recomputed from rewards: 0, .5, 1 -> mean .5, symmetric
    advs = [s.advantage for s in batch.samples[:3]]
    assert advs[0] == pytest.approx(-advs[2]) and advs[1] == pytest.approx(0.0, abs=1e-6)


def test_assigner_respects_async_level_and_pending(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    status = tmp_path / "status.json"
    a = LocalAssigner(status, store, run_seed=0, async_level=2, max_pending_groups=4)
    assert a.next("n", 0) == "no-trainer"
    write_json_atomic(status, {"step": 5, "done": False})
    assert a.next("n", 2) == "stale-policy"  # 5 − 2 > 2
    got = a.next("n", 3)
    assert isinstance(got, Assignment) and got.step == 5 and got.policy_step == 3
    _put(store, 5, 3, make_rows(), 1)
    _put(store, 5, 3, make_rows(), 2)
    assert a.next("n", 3) == "enough-pending"
    write_json_atomic(status, {"step": 6, "done": True})
    assert a.next("n", 4) == "done"


def test_batch_is_exact_and_surplus_groups_carry_over(tmp_path):
    store = LocalDirStore(tmp_path)
    rows = make_rows(groups=3, g=3, step=5, policy=4)  # three groups with signal
    _put(store, 5, 4, rows, 1)
    c = BatchCollector(store, Limits(group_size=3), async_level=2, poll_s=0.01)
    b1 = c.collect(step=5, need_groups=2)
    assert b1.groups == 2 and len(b1.samples) == 6 and len(c.carry) == 1
    assert b1.read_samples == 9  # reward_all sees every sample read
    for key in b1.consumed:
        store.delete(key)
    b2 = c.collect(step=6, need_groups=1)  # served from the carry, no file needed
    assert b2.groups == 1 and b2.accepted_files == 0 and b2.read_samples == 0
    assert [s.prompt_tokens for s in b2.samples] == [rows[6]["prompt_tokens"]] * 3
    c.carry = [b2.samples]
    _put(store, 9, 8, make_rows(groups=1, g=3, step=9, policy=8), 2)
    b3 = c.collect(step=9, need_groups=1)  # policy 4 < 9 − 2: the carried group is stale
    assert b3.stale_groups == 1 and b3.groups == 1 and b3.samples[0].policy_step == 8


def test_consumed_files_do_not_block_workers_and_return_after_a_crash(tmp_path):
    """Regression: pending files the trainer had read but not yet published blocked workers."""
    store = LocalDirStore(tmp_path / "store")
    status = tmp_path / "status.json"
    write_json_atomic(status, {"step": 5, "done": False})
    flat = make_rows(groups=2, g=3, step=5, policy=4)
    for r in flat:
        r["reward"] = 1.0  # no signal: the trainer needs more files than these
    for i in range(3):
        _put(store, 5, 4, [r | {"seed": i} for r in flat], i)  # three different files
    assigner = LocalAssigner(status, store, run_seed=0, async_level=2, max_pending_groups=4)
    assert assigner.next("n", 4) == "enough-pending"
    c = BatchCollector(store, Limits(group_size=3), async_level=2, poll_s=0.01)
    for key in store.list("rollouts"):
        c._take(key, 5, Batch(), 1)
    assert store.list("rollouts") == [] and len(store.list("consumed")) == 3
    assert isinstance(assigner.next("n", 4), Assignment)  # workers produce again
    assert restore_unpublished(store) == 3  # the step never published: files go back
    assert len(store.list("rollouts")) == 3 and store.list("consumed") == []
