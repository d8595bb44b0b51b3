"""A grading process: untrusted answers are judged in a child process that is
killed and replaced when one judgement runs past its time limit.

Parsers and scorers of third-party libraries (math-verify's SymPy, the
reasoning-gym scorers) can take unbounded time on a hostile answer, and their
own timeouts (`signal.alarm`) work only on a main thread. A separate process is
the bound that always holds. The child is `python -m <module>`; the module's
`serve(handler)` loop reads one JSON request per line and writes one JSON
answer per line, after a first "ready" line. It starts on first use, once per
grading process (a worker, a validator), and serves one request at a time.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("swarmrl.tasks.graders.checker")

START_TIMEOUT_S = 120.0  # the child imports its library once; slow on a loaded machine


class CheckerProcess:
    def __init__(self, module: str, timeout_s: float):
        self.module = module
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.timeouts = 0
        self.warmups: list = []  # requests every fresh child answers first (loading data)

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )  # fmt: skip
        if self._read(START_TIMEOUT_S) != "ready":
            self.close()
            raise RuntimeError(f"the checker process {self.module} did not start")
        for request in self.warmups:
            self._send(request)
            if self._read(START_TIMEOUT_S) is None:
                self.close()
                raise RuntimeError(f"the checker process {self.module} could not load {request}")

    def _send(self, request) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def warm(self, request) -> None:
        """Have this child, and every child that replaces it, answer `request` first,
        with the start-up time limit (for loading what later requests use)."""
        with self.lock:
            if request in self.warmups:
                return
            self.warmups.append(request)
            if self.proc is not None and self.proc.poll() is None:
                self._send(request)
                if self._read(START_TIMEOUT_S) is None:
                    self.close()

    def _read(self, timeout_s: float):
        """The child's next answer, or None after `timeout_s`."""
        got: list = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(timeout_s)
        if not got or not got[0]:
            return None
        return json.loads(got[0])

    def call(self, request):
        """The child's answer to `request`, or None if it gave none within the time
        limit (the child is then killed; the next call starts a fresh one)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            self._send(request)
            got = self._read(self.timeout_s)
            if got is None:
                self.timeouts += 1
                log.warning(
                    "%s: no answer within %.1f s; checker restarted", self.module, self.timeout_s
                )
                self.close()
            return got

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def serve(handler: Callable) -> None:
    """The child's loop: "ready", then one `handler(request)` answer per request."""
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        print(json.dumps(handler(json.loads(line))), flush=True)
