"""Rollout keys, store keys, and the trainer's batch collection over its queue seam."""

import pytest

from swarmrl.orchestrator.objects import check_key
from swarmrl.protocol.assign import Assignment, parse_rollout_key, rollout_key
from swarmrl.protocol.rollouts import Limits, sha256, write_rollouts
from swarmrl.trainer.batch import BatchCollector, QueuedFile
from tests.unit.test_rollouts import make_rows


class MemoryQueue:
    """The trainer's queue seam (trainer/batch.py, OrchestratorQueue) held in memory."""

    def __init__(self):
        self.files: dict[str, tuple[bytes, dict | None, bool]] = {}
        self.consumed: dict[str, int] = {}
        self.rejected: dict[str, str] = {}
        self.voided: set[str] = set()

    def put(self, key: str, data: bytes, verdict: dict | None = None, checked: bool = True):
        self.files[key] = (data, verdict, checked)

    def ready(self, step):
        ready = [
            QueuedFile(k, sha256(d), k, v, c)
            for k, (d, v, c) in sorted(self.files.items())
            if k not in self.consumed and k not in self.rejected
        ]
        return ready, len(self.rejected), 0, False

    def fetch(self, f):
        return self.files[f.key][0]

    def consume(self, step, key):
        if key in self.voided:
            return False
        self.consumed[key] = step
        return True

    def reject(self, key, reason):
        self.rejected[key] = reason


def put(queue, step, policy, rows, counter, verdict=None):
    a = Assignment(step=step, policy_step=policy, seed=0, counter=counter)
    key = rollout_key(a, "ab" * 16, 2)
    queue.put(key, rows if isinstance(rows, bytes) else write_rollouts(rows), verdict)
    return key


def test_store_keys_cannot_escape():
    assert check_key("rollouts/step_000001/a.parquet")
    for bad in ("../etc/passwd", "/abs", "a/../b", "a//b", "", "a/./b", "a b"):
        with pytest.raises(ValueError, match="invalid store key"):
            check_key(bad)


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


def test_collector_filters_stale_corrupt_and_zero_advantage():
    q = MemoryQueue()
    good = make_rows(groups=2, g=3, step=5, policy=4)
    flat = make_rows(groups=2, g=3, step=5, policy=4)
    for r in flat:
        r["reward"] = 1.0  # both groups have equal rewards: no signal
    put(q, 5, 2, make_rows(step=5, policy=2), 1)  # stale
    k_bad = put(q, 5, 4, b"not parquet at all", 2)
    put(q, 5, 4, flat, 3)
    k_good = put(q, 5, 4, good, 4)
    c = BatchCollector(q, Limits(group_size=3), async_level=2, poll_s=0.01)
    batch = c.collect(step=5, need_groups=2)
    assert batch.groups == 2 and len(batch.samples) == 6
    assert batch.stale_files == 1 and batch.rejected_files == 1 and batch.dropped_groups == 2
    assert batch.accepted_files == 2 and k_good in batch.consumed
    assert "not a readable parquet" in q.rejected[k_bad]
    # advantages were recomputed from rewards: 0, .5, 1 -> mean .5, symmetric
    advs = [s.advantage for s in batch.samples[:3]]
    assert advs[0] == pytest.approx(-advs[2]) and advs[1] == pytest.approx(0.0, abs=1e-6)


def test_batch_is_exact_and_surplus_groups_carry_over():
    q = MemoryQueue()
    rows = make_rows(groups=3, g=3, step=5, policy=4)  # three groups with signal
    put(q, 5, 4, rows, 1)
    c = BatchCollector(q, Limits(group_size=3), async_level=2, poll_s=0.01)
    b1 = c.collect(step=5, need_groups=2)
    assert b1.groups == 2 and len(b1.samples) == 6 and len(c.carry) == 1
    assert b1.read_samples == 9  # reward_all sees every sample read
    b2 = c.collect(step=6, need_groups=1)  # served from the carry, no file needed
    assert b2.groups == 1 and b2.accepted_files == 0 and b2.read_samples == 0
    assert [s.prompt_tokens for s in b2.samples] == [rows[6]["prompt_tokens"]] * 3
    c.carry = [b2.samples]
    put(q, 9, 8, make_rows(groups=1, g=3, step=9, policy=8), 2)
    b3 = c.collect(step=9, need_groups=1)  # policy 4 < 9 − 2: the carried group is stale
    assert b3.stale_groups == 1 and b3.groups == 1 and b3.samples[0].policy_step == 8


def test_a_file_voided_before_consumption_is_not_used():
    q = MemoryQueue()
    k1 = put(q, 5, 4, make_rows(groups=2, g=3, step=5, policy=4), 1)
    k2 = put(q, 5, 4, [r | {"seed": 7} for r in make_rows(groups=2, g=3, step=5, policy=4)], 2)
    q.voided.add(k1)  # its node was caught cheating after the file was listed
    batch = BatchCollector(q, Limits(group_size=3), async_level=2, poll_s=0.01).collect(5, 2)
    assert batch.consumed == [k2] and batch.accepted_files == 1


def test_samples_carry_what_was_sampled_and_a_foreign_temperature_is_refused():
    """An unchecked file chooses nothing the trainer's log-probs depend on: a file sampled
    at another temperature or nucleus than the run's is rejected; the others' samples
    carry their recorded log-probs, temperature, node, file and whether a validator
    checked them."""
    q = MemoryQueue()
    hot = [r | {"temperature": 1e-3} for r in make_rows(groups=2, g=3, step=5, policy=4)]
    k_hot = put(q, 5, 4, hot, 1)
    narrow = [r | {"top_p": 0.5, "seed": 3} for r in make_rows(groups=2, g=3, step=5, policy=4)]
    k_narrow = put(q, 5, 4, narrow, 2)
    rows = make_rows(groups=2, g=3, step=5, policy=4)
    k_ok = put(q, 5, 4, [r | {"seed": 9} for r in rows], 3)
    batch = BatchCollector(q, Limits(group_size=3), async_level=2, poll_s=0.01).collect(5, 2)
    assert "another temperature than the run's 1" in q.rejected[k_hot]
    assert "another top_p than the run's 1" in q.rejected[k_narrow]
    assert batch.consumed == [k_ok]
    s = batch.samples[0]
    assert s.behav_logprobs == pytest.approx(rows[0]["completion_logprobs"])
    assert s.temperature == pytest.approx(1.0) and s.file == k_ok and s.node == "ab" * 16
    assert s.checked is False  # no verdict: validation off in this collector
