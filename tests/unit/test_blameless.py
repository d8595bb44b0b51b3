"""A file is blamed only on evidence it carries: when the reader itself fails (its
decoding child dies, runs out of time, or our decoding code raises), the validator
calls the file `unverifiable` (blameless) and the trainer skips it, holding its
collection no longer than its read bound."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time

import pytest

from bench import rollout_bombs as bombs
from swarmrl.config import load_config
from swarmrl.protocol import rollouts
from swarmrl.protocol.assign import Assignment, rollout_key
from swarmrl.protocol.rollouts import Limits, write_rollouts
from swarmrl.protocol.verdict import BLAMELESS_CHECKS
from swarmrl.trainer.batch import BatchCollector
from swarmrl.validator.checks import Context, Reject, check_without_model
from tests.unit.test_store_and_batch import MemoryQueue

HERE = "tests.unit.test_blameless"
LIMITS = Limits(max_prompt_tokens=256, max_completion_tokens=512, max_rows=64, group_size=8)


# Stand-ins for the decoder, run in the capped child in its place: each fails in a way
# that is the reader's, not the file's.
def dies(data: bytes, params: dict):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(data: bytes, params: dict):
    time.sleep(600)


def raises(data: bytes, params: dict):
    return {}["a key our own code forgot"]  # a KeyError in the decoding code


def good_file(counter: int) -> tuple[str, bytes]:
    rows = [bombs.honest_row(group=g) | {"reward": float(j)} for g in range(2) for j in range(8)]
    rows = [r | {"reward": r["reward"] + counter / 100} for r in rows]  # bytes of its own
    return rollout_key(Assignment(5, 4, 0, counter), "ab" * 16, 2), write_rollouts(rows)


@pytest.mark.parametrize("decoder,reason,deadline", [
    ("dies", "died", 60.0), ("hangs", "longer than 2 s", 2.0), ("raises", "KeyError", 60.0),
])  # fmt: skip
def test_a_reader_failure_is_unverifiable_at_the_validator(
    decoder, reason, deadline, tmp_path, monkeypatch
):
    """(A short deadline only where the decoder hangs: a child that starts slowly on a
    loaded machine would otherwise time out before it could die or raise.)"""
    monkeypatch.setattr(rollouts, "DECODE_TARGET", f"{HERE}:{decoder}")
    cfg = load_config(
        None,
        [f"runs_dir={json.dumps(str(tmp_path / 'runs'))}", "name=t",
         "worker.group_size=8", "worker.groups_per_file=2"],
    )  # fmt: skip
    ctx = Context(cfg, None, None, None, 0.0, 0.0, 0.0, 0, 0, 0)
    ctx = dataclasses.replace(ctx, decode_timeout_s=deadline)
    key, data = good_file(1)
    t0 = time.monotonic()
    with pytest.raises(Reject) as e:
        check_without_model(ctx, key, data)
    assert e.value.check == "unverifiable" and e.value.check in BLAMELESS_CHECKS
    assert reason in e.value.reason, e.value.reason
    assert time.monotonic() - t0 < deadline + 30  # one deadline, whatever the child did


def test_a_file_that_times_out_the_decoder_does_not_hold_the_trainer(monkeypatch):
    """The hostile file comes first in key order; the trainer gives it its read bound,
    skips it without blame, takes the next file, and refuses it only when it fails a
    second time."""
    q = MemoryQueue()
    slow_key, slow = good_file(1)
    q.put(slow_key, slow)
    q.put(*good_file(2))
    collector = BatchCollector(q, LIMITS, async_level=2, poll_s=0.01)
    collector.read_timeout_s = 2.0
    real = rollouts.DECODE_TARGET

    def read(data, limits, max_decoded=None, timeout_s=rollouts.DECODE_TIMEOUT_S):
        if data == slow:  # the collector's own bound for the file that hangs
            monkeypatch.setattr(rollouts, "DECODE_TARGET", f"{HERE}:hangs")
            return rollouts.read_rollouts(data, limits, max_decoded, timeout_s)
        # the others with room for a child that starts slowly on a loaded machine
        monkeypatch.setattr(rollouts, "DECODE_TARGET", real)
        return rollouts.read_rollouts(data, limits, max_decoded, 60.0)

    monkeypatch.setattr("swarmrl.trainer.batch.read_rollouts", read)
    t0 = time.monotonic()
    batch = collector.collect(step=5, need_groups=2)
    assert time.monotonic() - t0 < 60  # the bound (2 s) and fresh children, not 120 s or 240 s
    assert batch.groups == 2 and slow_key not in q.rejected and batch.rejected_files == 0
    q.put(*good_file(3))
    batch = collector.collect(step=6, need_groups=2)
    assert batch.groups == 2 and "unreadable twice, no one blamed" in q.rejected[slow_key]
