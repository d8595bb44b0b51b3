"""A worker's pace against the orchestrator: when to ask for work again after an
answer without any (`AskPacer`), and how a file refused for the upload rate waits
for its turn (`upload_waiting`). Both measured in the emulated swarm
(bench/swarm_scale.py, docs/results.md)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from swarmrl.protocol.client import OrchestratorError

log = logging.getLogger("swarmrl.worker")

UPLOAD_TRIES = 3  # a file refused for the upload rate waits for a URL twice, then is dropped


def upload_waiting(upload: Callable[[], str], sleep=time.sleep) -> str:
    """`upload()`; refused for the upload rate (429: too many URLs this minute), the same
    file waits as told (at most a minute) and tries again, `UPLOAD_TRIES` times in all,
    rather than being dropped and the next assignment made in its place (a worker that
    outran the limit made file after file that was refused)."""
    for attempt in range(UPLOAD_TRIES):
        try:
            return upload()
        except OrchestratorError as e:
            if e.status != 429 or attempt + 1 == UPLOAD_TRIES:
                raise
            wait = min(60.0, e.retry_after_s or 5.0)
            log.warning("upload refused: %s; the file waits %.0fs", e, wait)
            sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises


class AskPacer:
    """How long a worker waits before asking for work again after an answer without
    any: `first_s` (worker.poll_s), doubling with each such answer up to `most_s` (the
    run's heartbeat period), back to `first_s` after an assignment. The wait is cut
    short when `changed()` says a newer version arrived (the answer may have been
    stale-policy). Asking every 0.2 s, 35 waiting workers sent the emulated swarm's
    orchestrator most of its requests (bench/swarm_scale.py); a fleet of waiting
    workers still asks often, each one seldom."""

    def __init__(self, first_s: float, most_s: float):
        self.first_s, self.most_s = first_s, max(first_s, most_s)
        self.next_s = first_s

    def assigned(self) -> None:
        self.next_s = self.first_s

    def wait(self, changed: Callable[[], bool], sleep=time.sleep) -> float:
        """Wait (in steps of `first_s`, watching `changed`); the seconds waited."""
        waited, total = 0.0, self.next_s
        while waited < total and not changed():
            step = min(self.first_s, total - waited)
            sleep(step)
            waited += step
        self.next_s = min(2 * self.next_s, self.most_s)
        return waited
