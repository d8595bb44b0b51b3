"""One supervisor for the processes a launcher starts on one machine.

A launcher (swarm.py, diloco.py, diloco_rl.py) describes what to run: one
`Proc` per process, with its argv, log file, threads and restart policy. The
`Supervisor` watches them, restarts the ones that die as their policy allows,
and turns SIGINT/SIGTERM into a stop; the launcher then stops them with
`stop_all` (or, where it only has to signal them, `Proc.signal`). What a run
shows stays with its launcher: the supervisor tells the launcher's `Watcher`
about each exit and lets it update its progress line once per poll.

Decisions:
- Process groups: every child starts in its own session, so a terminal's
  Ctrl-C reaches only the launcher, and a signal goes to the child's whole
  group (a trainer under torchrun, a DiLoCo site's own launcher and what it
  started).
- Parent-death signal: each child asks the kernel (prctl PR_SET_PDEATHSIG) for
  SIGTERM when the launcher dies, so a launcher killed with SIGKILL leaves no
  orphans. Linux only; elsewhere `stop_all` still kills the groups.
- Threads: OMP/MKL/OpenBLAS thread counts are set per process, so the
  processes share the machine's cores instead of each one taking all of them;
  output is unbuffered, so a log ends where its process stopped.
- Niceness: `Proc.niceness` is carried (the swarm gives its workers
  `launcher.worker_niceness`) but `start` does not apply it: every child runs
  at the launcher's priority.
- Graceful and hard stop: a graceful stop first waits up to `grace_s` for the
  processes that exit by themselves once the run is done (`exits_when_done`:
  workers, validators, the trainer), then sends SIGTERM to every group, waits
  up to `grace_s` again and sends SIGKILL to what is left; a hard stop skips
  the first wait. Either way every child is reaped and its log closed.
- Restart policy, per process: exit code 0 means done and the process is left
  alone, unless it is a server that must stay up (`keep_up`: the lighthouse,
  restarted after any exit). A code in `final_codes` (a worker the
  orchestrator refused) retires the process: never restarted, the run goes on.
  Any other exit restarts it, up to `max_restarts` times (None: no limit),
  with `restart_argv` where it has one (a site resumes from its checkpoint);
  past that the supervisor reports it given up, at every poll while it stays
  dead, and the launcher decides whether that ends the run. The exit of an
  `ends_run` process (the swarm's trainer), whatever its code, ends the watch.
- SIGINT/SIGTERM (those the launcher names) only set a flag, read once per
  poll, so a stop never cuts a restart in half; the handlers stay installed for
  the whole `with Supervisor(...)` block, so a second Ctrl-C cannot cut the
  stop short either.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

GRACE_S = 10.0

# restart: restarted now (Proc.restarts already counts it); give_up: out of
# restarts; retire: exited with one of its final_codes; end: an ends_run process.
Action = Literal["restart", "give_up", "retire", "end"]


def _die_with_parent(niceness: int = 0) -> None:  # runs in the child between fork and exec
    if niceness:
        os.nice(niceness)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: no parent-death signal; stop_all still kills the group
        pass


@dataclass
class Proc:
    """One process: what to run, how to restart it, and its running state."""

    name: str
    argv: list[str]
    log_path: Path
    threads: int = 1
    niceness: int = 0
    exits_when_done: bool = True  # False for servers (orchestrator, relays): they wait for a stop
    max_restarts: int | None = 0  # None: restarted without limit
    restart_argv: list[str] | None = None  # the command of a restart; None: argv again
    keep_up: bool = False  # restarted after any exit, 0 included
    final_codes: tuple[int, ...] = ()  # exit codes that retire it instead of a restart
    ends_run: bool = False  # its exit ends the watch; never restarted
    popen: subprocess.Popen | None = None
    restarts: int = 0
    retired: bool = False
    logf: object = field(default=None, repr=False)

    def start(self) -> None:
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(self.threads)
        env["PYTHONUNBUFFERED"] = "1"
        if self.logf:  # the previous run's handle: the child holds its own copy
            self.logf.close()
        self.logf = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self.logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def restart(self) -> None:
        if self.restart_argv is not None:
            self.argv = self.restart_argv
        self.start()

    def poll(self) -> int | None:
        """The exit code, or None while it runs or before its first start."""
        return self.popen.poll() if self.popen else None

    def signal(self, sig: int) -> None:
        if self.popen and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def stop_all(procs: list[Proc], graceful: bool, grace_s: float = GRACE_S) -> None:
    """Stop every process (see the module docstring), reap it and close its log."""
    if graceful:  # workers exit by themselves once the trainer reports done
        deadline = time.time() + grace_s
        while time.time() < deadline and any(p.poll() is None for p in procs if p.exits_when_done):
            time.sleep(0.1)
    for p in procs:
        p.signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        p.signal(signal.SIGKILL)
        if p.popen:
            p.popen.wait()
        if p.logf:
            p.logf.close()


class Watcher(Protocol):
    """What a launcher shows and decides while the supervisor watches its processes.

    Each method returns an exit code to end the watch with, or None to go on.
    """

    def exited(self, proc: Proc, code: int, action: Action) -> int | None:
        """`proc` exited with `code`; the supervisor does `action` (a restart after this call)."""

    def round(self, seen: dict[str, int | None]) -> int | None:
        """Once per poll, after the exits; `seen`: each process's code at this poll's start."""

    def interrupted(self, signum: int) -> int:
        """One of the supervisor's stop signals arrived."""


class Supervisor:
    """Watches processes and restarts them by their policy; a `with` block holds the signals."""

    def __init__(
        self, procs: list[Proc], stop_signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
    ):
        self.procs = procs
        self.stop_signals = stop_signals
        self.stop_requested: int | None = None
        self._old_handlers: dict = {}

    def __enter__(self) -> Supervisor:
        self._old_handlers = {s: signal.signal(s, self._on_signal) for s in self.stop_signals}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old_handlers.items():
            signal.signal(s, handler)

    def _on_signal(self, signum, _frame) -> None:
        self.stop_requested = signum

    def watch(self, poll_s: float, watcher: Watcher) -> int:
        """Poll every `poll_s` until the watcher returns an exit code; returns it."""
        while True:
            if self.stop_requested is not None:
                return watcher.interrupted(self.stop_requested)
            seen: dict[str, int | None] = {}
            for p in self.procs:
                seen[p.name] = code = p.poll()
                action = self._action(p, code)
                if action is None:
                    continue
                if action == "restart":
                    p.restarts += 1
                elif action == "retire":
                    p.retired = True
                result = watcher.exited(p, code, action)
                if action == "restart":
                    p.restart()
                if result is not None:
                    return result
            result = watcher.round(seen)
            if result is not None:
                return result
            time.sleep(poll_s)

    @staticmethod
    def _action(p: Proc, code: int | None) -> Action | None:
        if code is None or p.retired:
            return None
        if p.ends_run:
            return "end"
        if code == 0 and not p.keep_up:
            return None
        if code in p.final_codes:
            return "retire"
        if p.max_restarts is not None and p.restarts >= p.max_restarts:
            return "give_up"
        return "restart"
