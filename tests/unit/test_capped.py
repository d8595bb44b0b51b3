"""The capped child (swarmrl/capped.py): only the function's own reason is a refusal
(the input's fault); a cap, a crash, an error in our code, a deadline or the machine
is a failure that blames no one; and no request holds the caller past its deadline."""

import os
import signal
import threading
import time

import pytest

from swarmrl import capped

TARGETS = "tests.unit.test_capped"


def echo(data: bytes, params: dict) -> bytes:
    return data[::-1]


def refuse(data: bytes, params: dict) -> bytes:
    raise ValueError("not rollouts")


def hog(data: bytes, params: dict) -> bytes:
    return b"x" * params["bytes"]  # one allocation of the asked size


def sleep(data: bytes, params: dict) -> bytes:
    time.sleep(params["s"])
    return b""


def die(data: bytes, params: dict) -> bytes:
    os.kill(os.getpid(), signal.SIGKILL)


def buggy(data: bytes, params: dict) -> bytes:
    return data + "text"  # a TypeError: a fault in the decoding code, not in the input


@pytest.fixture
def child():
    c = capped.Capped()
    yield c
    c.close()


def test_answers_and_refusals(child):
    assert child.call(f"{TARGETS}:echo", b"abc", {}, 64 << 20, 60) == b"cba"
    with pytest.raises(capped.CappedRefusal, match="not rollouts"):
        child.call(f"{TARGETS}:refuse", b"", {}, 64 << 20, 60)
    with pytest.raises(capped.CappedFailure, match="more than its 32 MiB") as e:
        child.call(f"{TARGETS}:hog", b"", {"bytes": 256 << 20}, 32 << 20, 60)
    assert not isinstance(e.value, ValueError)  # no caller can take it for a refusal
    # the child that hit its cap was replaced; the next request is served
    assert child.call(f"{TARGETS}:echo", b"ab", {}, 64 << 20, 60) == b"ba"


@pytest.mark.parametrize("target,reason", [("die", "died"), ("buggy", "TypeError")])
def test_a_death_or_our_own_error_is_a_failure_not_a_refusal(child, target, reason):
    child.call(f"{TARGETS}:echo", b"", {}, 64 << 20, 60)  # a child that served before:
    with pytest.raises(capped.CappedFailure, match=reason):  # tried again, fresh, and
        child.call(f"{TARGETS}:{target}", b"", {}, 64 << 20, 60)  # failed again
    assert child.call(f"{TARGETS}:echo", b"ab", {}, 64 << 20, 60) == b"ba"


def test_a_target_that_cannot_run_is_unavailable_not_a_refusal(child):
    """An honest file must not be blamed for this machine's fault: the trainer and the
    validator reject the sender on a refusal, so this is another exception."""
    with pytest.raises(capped.CappedUnavailable, match="ModuleNotFoundError"):
        child.call("swarmrl.no_such_module:f", b"", {}, 64 << 20, 60)
    assert not isinstance(capped.CappedUnavailable("x"), ValueError)
    assert isinstance(capped.CappedUnavailable("x"), capped.CappedFailure)


def test_a_slow_target_is_stopped_at_its_deadline_and_not_tried_again(child):
    child.call(f"{TARGETS}:echo", b"", {}, 64 << 20, 60)  # a child that served before
    t0 = time.monotonic()
    with pytest.raises(capped.CappedFailure, match="longer than 2 s"):
        child.call(f"{TARGETS}:sleep", b"", {"s": 60}, 64 << 20, 2.0)
    # one deadline for the call: the old code tried a timeout again in a fresh child,
    # which held a caller for twice its deadline (and a hostile file for 240 s)
    assert time.monotonic() - t0 < 3.9  # a second try, as before, made it 4 s or more


def test_a_child_that_stops_reading_cannot_block_the_write(child):
    """The data is written from a thread: a child stuck before reading a large request
    is killed at the deadline, which ends the write; the call fails (no one blamed)
    and the next request is served by a fresh child."""
    child.call(f"{TARGETS}:echo", b"", {}, 64 << 20, 60)  # started
    stuck = child._child
    stuck.send_signal(signal.SIGSTOP)  # it reads nothing more
    answers = []
    data = b"z" * (8 << 20)  # far more than a pipe holds

    def call():
        try:
            child.call(f"{TARGETS}:echo", data, {}, 64 << 20, 2.0)
        except capped.CappedFailure as e:
            answers.append(e)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(60)
    assert len(answers) == 1 and "longer than" in str(answers[0])
    assert stuck.poll() is not None
    assert child.call(f"{TARGETS}:echo", data, {}, 64 << 20, 60) == data[::-1]
    assert child._child is not stuck
