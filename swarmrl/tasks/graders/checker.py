"""A grading process: untrusted answers are judged in a child process that is
killed and replaced when one judgement runs past its time limit.

Parsers and scorers of third-party libraries (math-verify's SymPy, the
reasoning-gym scorers) can take unbounded time on a hostile answer, and their
own timeouts (`signal.alarm`) work only on a main thread. A separate process is
the bound that always holds. The child is `python -m <module>`; the module's
`serve(handler)` loop reads one JSON request per line and writes one JSON
answer per line, after a first "ready" line. It starts on first use, once per
grading process (a worker, a validator), and serves one request at a time.

A judgement that gives no answer (past its time limit, or the child died) scores 0
where a worker grades its own completions. A validator re-grades inside
`strict()`: there the same case raises `RewardUnavailable`, because a score the
validator could not compute on its machine is no evidence against the sender
(validator/checks.py calls such a file `unverifiable`).

The answers travel on a descriptor of their own: what the graded code prints
goes to stderr, so it cannot shift the stream of answers. The child runs with a
fixed hash seed, so the order of a set of strings is the same in every child on
every node.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("swarmrl.tasks.graders.checker")

START_TIMEOUT_S = 120.0  # the child imports its library once; slow on a loaded machine
_STRICT = contextvars.ContextVar("strict_grading", default=False)


class RewardUnavailable(RuntimeError):
    """Inside `strict()`: a grading process gave no answer (its time limit, or it died)."""


@contextlib.contextmanager
def strict():
    """Within: a grading call with no answer raises RewardUnavailable instead of
    returning None (which the graders score 0)."""
    token = _STRICT.set(True)
    try:
        yield
    finally:
        _STRICT.reset(token)


class CheckerProcess:
    def __init__(self, module: str, timeout_s: float):
        self.module = module
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.timeouts = 0
        self.crashed = False  # the last call's child died instead of answering
        self.started = False
        self.warmups: list = []  # requests every fresh child answers first (loading data)

    def _start(self) -> None:
        if not self.started:
            atexit.register(self.close)  # no child outlives a parent that exits
            self.started = True
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env={**os.environ, "PYTHONHASHSEED": "0"},
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
        try:
            return json.loads(got[0])
        except ValueError:  # not an answer of serve(): the child is not to be trusted
            return None

    def call(self, request):
        """The child's answer to `request`, or None if it gave none within the time
        limit or died first (`crashed` says which; the child is then killed, and the
        next call starts a fresh one)."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            self._send(request)
            got = self._read(self.timeout_s)
            self.crashed = False
            if got is None:
                try:  # a dead child's end of stream can come before its exit status
                    self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                self.crashed = self.proc.returncode is not None
                self.timeouts += 1
                log.warning(
                    "%s: %s; checker restarted", self.module,
                    "the child died" if self.crashed else f"no answer within {self.timeout_s:.1f} s",
                )  # fmt: skip
                self.close()
        if got is None and _STRICT.get():
            what = "died" if self.crashed else f"gave no answer within {self.timeout_s:.0f} s"
            raise RewardUnavailable(f"the grading process {self.module} {what}")
        return got

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def serve(handler: Callable) -> None:
    """The child's loop: "ready", then one `handler(request)` answer per request, on
    the original stdout; the handler's own prints go to stderr. It ends when its
    parent closes stdin (also by exiting) or kills it, or a Ctrl-C reaches it."""
    import signal

    # a Ctrl-C in the terminal ends this child at once and quietly (no traceback between
    # the parent's lines). Not PR_SET_PDEATHSIG: it fires when the *thread* that started
    # the child ends, and another thread may still be waiting on an answer
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    print(json.dumps("ready"), file=answers, flush=True)
    for line in sys.stdin:
        print(json.dumps(handler(json.loads(line))), file=answers, flush=True)
