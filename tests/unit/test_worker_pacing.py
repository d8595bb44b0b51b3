"""A worker told to wait asks again after a pause that doubles up to the heartbeat
period, cut short by a new version, and asks at once again after an assignment
(inference/worker.py: `AskPacer`)."""

from __future__ import annotations

from swarmrl.inference.worker import AskPacer


def test_waits_double_to_the_heartbeat_and_restart_after_an_assignment():
    slept: list[float] = []
    pacer = AskPacer(0.2, 2.0)
    never = lambda: False  # noqa: E731
    waits = [round(pacer.wait(never, slept.append), 6) for _ in range(6)]
    assert waits == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    assert max(slept) <= 0.2 + 1e-9  # in steps of the poll, watching for a version
    pacer.assigned()
    assert round(pacer.wait(never, slept.append), 6) == 0.2


def test_a_new_version_cuts_the_wait_short():
    pacer = AskPacer(0.2, 2.0)
    for _ in range(4):
        pacer.wait(lambda: False, lambda s: None)
    polls = iter([False, False, True])  # the version lands during the third poll
    assert round(pacer.wait(lambda: next(polls), lambda s: None), 6) == 0.4
