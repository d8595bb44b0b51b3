"""The Python tool: the model writes a program between <python> and </python>, and
the environment answers what it printed, run in the code sandbox.

A validator runs the same program again and compares, so the answer must be the
same on any machine. The sandbox's deterministic mode (tasks/graders/sandbox.py)
fixes what most programs could read differently: str and bytes hashes (set
order), `random`, os.urandom and the time module's clocks. Left open, and
handled by the validator as its own uncertainty (`doubt`), not as a forgery:

- a program that reads what is not fixed (object addresses through `id` or a
  default repr, /proc): the validator's two runs differ;
- a program near the CPU limit: it may finish on one machine and not on
  another, so an answer of `TIME_LIMIT` on either side proves nothing.

Such a file is refused with the check `unverifiable`, and no one is punished.

The answer: the program's standard output; on a failure, that and the last line
of its standard error (the exception); `error: ...` when the sandbox stopped it.
The caller cuts it to the tools' answer length (envs/tools.py RESULT_CHARS).
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass

from swarmrl.errors import ConfigError

TIME_LIMIT = "error: time limit"
OUTPUT_BYTES = 64 * 1024  # read back at most this much (the answer keeps far less)


@dataclass(frozen=True)
class PythonLimits:
    """The sandbox's bounds on a tool program: the same on every worker and validator."""

    cpu_s: int = 2
    memory_mb: int = 256
    isolation: str = "namespace"  # the code sandbox's, the same on every node ("process")


def run_program(code: str, limits: PythonLimits = PythonLimits()) -> str:
    """What the tool answers `code`."""
    from swarmrl.tasks.graders.sandbox import TIMER_EXIT, Limits, run_python

    box = Limits(
        cpu_s=limits.cpu_s + 1,  # RLIMIT_CPU: the backstop behind the program's own timer
        wall_s=2.0 * limits.cpu_s + 2.0,
        memory_mb=limits.memory_mb,
        file_mb=1,
        processes=16,
        output_bytes=OUTPUT_BYTES,
        tmpfs_mb=16,
    )
    r = run_python(code, "", box, limits.isolation, deterministic=True, cpu_timer_s=limits.cpu_s)
    # a program that undid its timer dies by RLIMIT_CPU, the wall clock, or (in a
    # namespace) with unshare's message: any failure after the budget is the time limit
    late = r.exit_code != 0 and r.seconds >= limits.cpu_s
    if r.killed == "timeout" or r.exit_code in (TIMER_EXIT, -signal.SIGXCPU) or late:
        return TIME_LIMIT  # what it printed before then depends on the machine's speed
    if r.killed == "output":
        return "error: the program printed too much"
    if r.killed == "too-long":
        return "error: the program is too long"
    if r.exit_code == 0:
        return r.stdout
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    last = lines[-1] if lines else f"error: exit status {r.exit_code}"
    return f"{r.stdout}{last}"


def interpreter_version() -> str:
    """This interpreter's major.minor: what a program's answers depend on."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_interpreter(wanted: str) -> None:
    """Refuse to answer Python tool calls on another interpreter than the run's."""
    if wanted and wanted != interpreter_version():
        raise ConfigError(
            f"this run's Python tool runs programs with Python {wanted} (env.python_version), "
            f"and this node runs Python {interpreter_version()}: a program's answers (error "
            f"messages first) differ between versions, so run this node with Python {wanted}"
        )
