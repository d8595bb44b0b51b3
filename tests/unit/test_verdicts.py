"""Verdicts: signed records, the ledger, and the trainer taking only what a validator accepted."""

from __future__ import annotations

import json

import pytest

from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.rollouts import Limits, sha256, write_rollouts
from swarmrl.protocol.verdict import Verdict, read_verdict
from swarmrl.trainer.batch import BatchCollector
from tests.unit.test_rollouts import make_rows
from tests.unit.test_store_and_batch import MemoryQueue, put


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


def _collector(queue, key, spot_checks=False):
    return BatchCollector(
        queue, Limits(group_size=3), async_level=2, poll_s=0.01,
        validators=[public_key_hex(key)], spot_checks=spot_checks,
    )  # fmt: skip


def _signed(key, data, vkey, **kw) -> dict:
    return json.loads(_verdict(key, data, **kw).signed(vkey).to_json())


@pytest.mark.parametrize("case", ["forged", "changed", "rejected", "other-key", "none"])
def test_trainer_refuses_files_whose_verdict_does_not_hold(validator_key, tmp_path, case):
    q = MemoryQueue()
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    good_data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    good = put(q, 5, 4, good_data, 2)
    q.put(good, good_data, _signed(good, good_data, validator_key))
    key = put(q, 5, 4, data, 1)
    if case == "forged":
        v = _signed(key, data, load_or_create_key(tmp_path / "keys" / "worker.key"))
    elif case == "changed":
        v = _signed(key, data + b"\0", validator_key)  # judged other bytes
    elif case == "rejected":
        v = _signed(key, data, validator_key, accepted=False, check="proof")
    elif case == "other-key":
        v = _signed(good, data, validator_key)  # a verdict about another file
    else:
        v = None  # every file must be validated: no verdict is no acceptance
    q.put(key, data, v)
    batch = _collector(q, validator_key).collect(5, 2)
    assert batch.accepted_files == 1 and batch.rejected_files == 1  # only the good file
    assert list(q.rejected) == [key] and batch.consumed == [good]


def test_spot_checked_runs_take_files_not_drawn_for_validation(validator_key):
    q = MemoryQueue()
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    key = put(q, 5, 4, data, 1)
    q.put(key, data, None, checked=False)
    assert _collector(q, validator_key, spot_checks=True).collect(5, 2).consumed == [key]


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


def test_the_trainer_never_takes_the_same_bytes_twice(validator_key):
    q = MemoryQueue()
    data = write_rollouts(make_rows(groups=2, g=3, step=5, policy=4))
    c = _collector(q, validator_key)
    for counter in (1, 2):  # the same bytes under two names, both with good verdicts
        key = put(q, 5, 4, data, counter)
        q.put(key, data, _signed(key, data, validator_key))
    good = write_rollouts([r | {"seed": 9} for r in make_rows(groups=2, g=3, step=5, policy=4)])
    key = put(q, 5, 4, good, 3)
    q.put(key, good, _signed(key, good, validator_key))
    batch = c.collect(5, 4)
    assert batch.accepted_files == 2 and batch.rejected_files == 1
