"""The capped child (swarmrl/capped.py): what is the input's fault is a refusal, what
is the machine's is not, and no request can hold the caller past its deadline."""

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


@pytest.fixture
def child():
    c = capped.Capped()
    yield c
    c.close()


def test_answers_and_refusals(child):
    assert child.call(f"{TARGETS}:echo", b"abc", {}, 64 << 20, 60) == b"cba"
    with pytest.raises(capped.CappedRefusal, match="not rollouts"):
        child.call(f"{TARGETS}:refuse", b"", {}, 64 << 20, 60)
    with pytest.raises(capped.CappedRefusal, match="more than its 32 MiB"):
        child.call(f"{TARGETS}:hog", b"", {"bytes": 256 << 20}, 32 << 20, 60)
    # the child that hit its cap was replaced; the next request is served
    assert child.call(f"{TARGETS}:echo", b"ab", {}, 64 << 20, 60) == b"ba"


def test_a_target_that_cannot_run_is_unavailable_not_a_refusal(child):
    """An honest file must not be blamed for this machine's fault: the trainer and the
    validator reject the sender on a refusal, so this is another exception."""
    with pytest.raises(capped.CappedUnavailable, match="ModuleNotFoundError"):
        child.call("swarmrl.no_such_module:f", b"", {}, 64 << 20, 60)
    assert not isinstance(capped.CappedUnavailable("x"), ValueError)


def test_a_slow_target_is_stopped_at_its_deadline(child):
    t0 = time.monotonic()
    with pytest.raises(capped.CappedRefusal, match="longer than"):
        child.call(f"{TARGETS}:sleep", b"", {"s": 60}, 64 << 20, 1.0)
    assert time.monotonic() - t0 < 30  # the deadline, a fresh child's start and its try


def test_a_child_that_stops_reading_cannot_block_the_write(child):
    """The data is written from a thread: a child stuck before reading a large request
    is killed at the deadline, which ends the write, and the request is served by a
    fresh child."""
    child.call(f"{TARGETS}:echo", b"", {}, 64 << 20, 60)  # started
    stuck = child._child
    stuck.send_signal(signal.SIGSTOP)  # it reads nothing more
    answers = []
    data = b"z" * (8 << 20)  # far more than a pipe holds
    caller = threading.Thread(
        target=lambda: answers.append(child.call(f"{TARGETS}:echo", data, {}, 64 << 20, 2.0)),
        daemon=True,
    )
    caller.start()
    caller.join(60)
    assert answers == [data[::-1]]
    assert stuck.poll() is not None and child._child is not stuck
