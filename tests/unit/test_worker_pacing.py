"""A worker told to wait asks again after a pause that doubles up to the heartbeat
period, cut short by a new version, and asks at once again after an assignment
(inference/pacing.py: `AskPacer`)."""

from __future__ import annotations

from swarmrl.inference.pacing import AskPacer


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


def test_a_file_refused_for_the_upload_rate_waits_and_is_sent_again():
    import pytest

    from swarmrl.inference.pacing import UPLOAD_TRIES, upload_waiting
    from swarmrl.protocol.client import OrchestratorError

    def answering(*answers):
        it = iter(answers)

        def upload() -> str:
            a = next(it)
            if isinstance(a, Exception):
                raise a
            return a

        return upload

    slept: list[float] = []
    limit = OrchestratorError(429, "more than 60 upload URLs", "/v1/uploads", 12.0)
    assert upload_waiting(answering(limit, "key"), slept.append) == "key"
    assert slept == [12.0]  # as the Retry-After said
    busy = OrchestratorError(429, "busy", "/v1/uploads", None)
    with pytest.raises(OrchestratorError, match="busy"):
        upload_waiting(answering(*[busy] * UPLOAD_TRIES), slept.append)
    assert slept == [12.0, 5.0, 5.0]  # no Retry-After: 5 s; then given up
    ejected = OrchestratorError(403, "this key is ejected", "/v1/uploads")
    with pytest.raises(OrchestratorError, match="ejected"):
        upload_waiting(answering(ejected), slept.append)
    assert slept == [12.0, 5.0, 5.0]  # refused outright: no wait
