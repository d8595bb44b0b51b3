"""Verdicts: signed records, the ledger, and the trainer taking only what a validator accepted."""

from __future__ import annotations

import json

import pytest

from swarmrl.inference.rollouts import Limits, write_rollouts
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.store import LocalDirStore
from swarmrl.trainer.batch import BatchCollector
from swarmrl.validator.checks import sha256
from swarmrl.validator.record import Ledger, Verdict, read_verdict, verdict_key
from tests.unit.test_rollouts import make_rows
from tests.unit.test_store_and_batch import _put


@pytest.fixture
def validator_key(tmp_path):
    return load_or_create_key(tmp_path / "keys" / "validator-0.key")


def _verdict(key, data, accepted=True, **kw) -> Verdict:
    return Verdict(key, sha256(data), "ab" * 16, 5, 4, accepted, **kw)


def test_signed_verdicts_verify_and_tampering_is_refused(validator_key, tmp_path):
    trusted = [public_key_hex(validator_key)]
    v = _verdict("rollouts/step_000005/x.parquet", b"data").signed(validator_key)
    assert read_verdict(v.to_json(), trusted) == v
    flipped = json.loads(v.to_json()) | {"accepted": False}
    assert read_verdict(json.dumps(flipped).encode(), trusted) is None
    other = load_or_create_key(tmp_path / "keys" / "other.key")
    forged = _verdict("rollouts/step_000005/x.parquet", b"data").signed(other)
    assert read_verdict(forged.to_json(), trusted) is None
    for junk in (b"", b"{", b"[]", b'{"key": 1}', json.dumps({"extra": 1}).encode()):
        assert read_verdict(junk, trusted) is None


def test_ledger_finds_replays_by_bytes_and_by_assignment(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    v = _verdict("rollouts/step_000005/ab-3-p000004-g2.parquet", b"one")
    ledger.record(v, counter=3)
    assert ledger.replay_of(sha256(b"one"), "cd", 9, 9) == v.key
    assert ledger.replay_of(sha256(b"two"), v.node, 5, 3) == v.key
    assert ledger.replay_of(sha256(b"two"), v.node, 5, 4) is None
    ledger.close()
    again = Ledger(tmp_path / "ledger.sqlite")  # persistent
    assert again.replay_of(sha256(b"one"), "", 0, 0) == v.key


def _collector(store, key):
    return BatchCollector(
        store, Limits(group_size=3), async_level=2, poll_s=0.01, validators=[public_key_hex(key)]
    )


def test_trainer_waits_for_a_verdict_then_takes_only_accepted_bytes(validator_key, tmp_path):
    store = LocalDirStore(tmp_path / "store")
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    key = _put(store, 5, 4, data, 1)
    c = _collector(store, validator_key)
    polls = []
    with pytest.raises(InterruptedError):  # no verdict yet: nothing is taken
        c.collect(5, 2, should_stop=lambda: polls.append(1) or len(polls) > 3)
    assert store.list("rollouts") == [key]
    store.put(verdict_key(key), _verdict(key, data).signed(validator_key).to_json())
    batch = c.collect(5, 2)
    assert batch.groups == 2 and batch.accepted_files == 1


@pytest.mark.parametrize("case", ["forged", "changed", "rejected", "other-key"])
def test_trainer_refuses_files_whose_verdict_does_not_hold(validator_key, tmp_path, case):
    store = LocalDirStore(tmp_path / "store")
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    key = _put(store, 5, 4, data, 1)
    good_data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    good = _put(store, 5, 4, good_data, 2)
    store.put(verdict_key(good), _verdict(good, good_data).signed(validator_key).to_json())
    v = _verdict(key, data)
    if case == "forged":
        v = v.signed(load_or_create_key(tmp_path / "keys" / "worker.key"))
    elif case == "changed":
        v = v.signed(validator_key)
        store.put(key, data + b"\0")  # swapped after it was judged
    elif case == "rejected":
        v = _verdict(key, data, accepted=False, check="proof").signed(validator_key)
    else:
        v = _verdict(good, data).signed(validator_key)  # a verdict about another file
    store.put(verdict_key(key), v.to_json())
    batch = _collector(store, validator_key).collect(5, 2)
    assert batch.accepted_files == 1 and batch.rejected_files == 1  # only the good file
    reasons = [k for k in store.list("rejected") if k.endswith(".reason.txt")]
    assert len(reasons) == 1 and store.list("rollouts") == []


def test_a_consumed_file_uploaded_again_meets_no_verdict(validator_key, tmp_path):
    """The verdict moves with the consumed file: the same bytes put again under the same
    name wait for a new verdict (the validator's ledger then calls it a replay), and a
    crash before publishing brings file and verdict back together."""
    from swarmrl.trainer.batch import delete_consumed, restore_unpublished

    store = LocalDirStore(tmp_path / "store")
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    key = _put(store, 5, 4, data, 1)
    store.put(verdict_key(key), _verdict(key, data).signed(validator_key).to_json())
    c = _collector(store, validator_key)
    batch = c.collect(5, 2)
    assert batch.accepted_files == 1 and not store.exists(verdict_key(key))
    store.put(key, data)  # the replay
    polls = []
    with pytest.raises(InterruptedError):
        c.collect(6, 2, should_stop=lambda: polls.append(1) or len(polls) > 3)
    store.delete(key)
    assert restore_unpublished(store) == 1  # the crash: file and verdict back in the queue
    assert store.exists(key) and store.exists(verdict_key(key))
    again = _collector(store, validator_key).collect(5, 2)
    assert again.accepted_files == 1
    delete_consumed(store, again.consumed)
    assert store.list("consumed") == []


def test_verdicts_that_would_crash_a_parser_are_just_untrusted(validator_key):
    trusted = [public_key_hex(validator_key)]
    v = json.loads(_verdict("rollouts/step_000005/x.parquet", b"d").signed(validator_key).to_json())
    for bad in (
        json.dumps(v | {"signature": 12345}).encode(),
        json.dumps(v | {"accepted": "yes"}).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # deep nesting: RecursionError inside json
        b"\xff\xfe\x00",
    ):
        assert read_verdict(bad, trusted) is None


def test_verdict_names_are_one_to_one():
    assert verdict_key("rollouts/a/x") != verdict_key("rollouts/a/x.parquet")


def test_two_validators_cannot_both_claim_one_assignment(tmp_path):
    a, b = Ledger(tmp_path / "l.sqlite"), Ledger(tmp_path / "l.sqlite")
    assert a.claim(sha256(b"one"), "k1", "ab", 5, 3) is None
    assert b.claim(sha256(b"two"), "k2", "ab", 5, 3) == "k1"  # same assignment, other bytes
    assert b.claim(sha256(b"one"), "k3", "cd", 6, 1) == "k1"  # same bytes, other name
    assert b.claim(sha256(b"one"), "k1", "ab", 5, 3) is None  # k1 again: a pending claim, ours
    a.settle(sha256(b"one"), True)
    assert b.claim(sha256(b"one"), "k1", "ab", 5, 3) == "k1"  # settled: now a replay


def test_the_trainer_never_takes_the_same_bytes_twice(validator_key, tmp_path):
    store = LocalDirStore(tmp_path / "store")
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    c = _collector(store, validator_key)
    for counter in (1, 2):  # the same bytes under two names, both with good verdicts
        key = _put(store, 5, 4, data, counter)
        store.put(verdict_key(key), _verdict(key, data).signed(validator_key).to_json())
    good = write_rollouts([r | {"seed": 9} for r in make_rows(groups=2, g=3, step=5, policy=4)])
    key = _put(store, 5, 4, good, 3)
    store.put(verdict_key(key), _verdict(key, good).signed(validator_key).to_json())
    batch = c.collect(5, 4)
    assert batch.accepted_files == 2 and batch.rejected_files == 1
