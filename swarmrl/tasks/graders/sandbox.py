"""Run untrusted Python (a model's completion) in a contained subprocess.

Workers and validators both run model-written code to grade it, so a program
that misbehaves must cost a bounded amount of time and leave the machine as it
was. Each run is one fresh process:

What it covers
- **Time.** `RLIMIT_CPU` (the kernel kills it after `cpu_s` of CPU) and a
  wall-clock deadline after which the whole process group is killed with
  SIGKILL. In namespace isolation the program is also PID 1's descendant in its
  own PID namespace, and `unshare --kill-child` takes that namespace down with
  it, so a child that left the process group (setsid) dies too.
- **Memory, files, processes.** `RLIMIT_AS` (address space), `RLIMIT_FSIZE`
  (largest file it may write), `RLIMIT_NPROC` (processes; a fork bomb stops
  there), `RLIMIT_NOFILE`, no core dumps. Output read back is capped at
  `output_bytes`.
- **Environment.** A clean environment (PATH, HOME, LANG only: nothing of the
  parent's, no keys or tokens), `python -I -S` (no user site, no PYTHON*
  variables) with `-S`: the standard library only, no site-packages (faster
  to start, and nothing installed beside swarmrl is reachable), in a fresh
  working directory that is deleted afterwards.
- **Network and filesystem, namespace isolation** (`isolation = "namespace"`,
  picked by "auto" where `unshare` works): a new network namespace with only
  a downed loopback (every connect fails), a new mount namespace in which
  /tmp, /var/tmp and /dev/shm are fresh tmpfs mounts (the host's are not
  visible, and writes there vanish with the run), and /proc shows only the
  sandbox's processes (the parent's environment and command line are out of
  sight). When the caller is root the program runs as `nobody` (uid 65534)
  with no capabilities and `no_new_privs`, so it cannot write the project,
  read root's files, or signal the processes that started it, and the process
  limit counts against that user. When the caller is not root, an
  unprivileged user namespace provides the namespaces; the program then runs
  with the caller's own file permissions outside the tmpfs mounts. The
  interpreter is the base installation's (`sys._base_executable`, for
  symlinked and copied virtual environments alike; programs run with -I -S);
  if it, its standard library or its installation prefix lies under one of
  the replaced directories, namespace isolation is unavailable and "auto"
  falls back.

What it does not cover
- **Process isolation fallback** (`isolation = "process"`, or "auto" where
  `unshare` is refused): rlimits, the process group, the clean environment
  and the working directory only. The program can open sockets (an audit hook
  refuses `socket.*` calls from Python, which native code or ctypes bypass),
  write wherever the user may, and signal the user's other processes. Run
  workers as a dedicated user, or in a container, where namespaces are
  refused.
- **Grade forgery from inside the process.** Assert-style tests run in the
  same interpreter as the solution; code that inspects the harness's frames
  can fake a pass. The harness defeats the cheap ways (exiting early with
  status 0, printing a fake success line): a test passes only when the
  harness's random token comes back on a pipe the solution never learns the
  number of. Stdin/stdout tests are compared by the parent and cannot be
  faked this way.
- **CPU contention.** Limits bound each run, not the machine's load: the
  caller decides how many run at once.
- **Other languages.** Python only.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("swarmrl.tasks.graders.sandbox")

NOBODY = 65534
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")  # a fresh tmpfs on each in namespace mode
MAX_CODE_BYTES = 64 * 1024  # a longer program is not run (scores 0)

# Runs inside the namespaces, as root of them: private tmpfs mounts, the program's
# directory on one of them, then (when the caller is root) drop to nobody and exec.
_SETUP = r"""
set -e
exec 3<"$1/main.py"
for d in @PRIVATE_DIRS@; do
  [ -d "$d" ] && mount -t tmpfs -o "size=${3}k,mode=1777,nosuid,nodev" tmpfs "$d"
done
mkdir /tmp/run && cat <&3 >/tmp/run/main.py && exec 3<&-
cd /tmp/run
shift 3
if [ "$(id -u)" = 0 ] && [ "$SANDBOX_DROP" = 1 ]; then
  chown -R 65534:65534 /tmp/run
  exec setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \
    --inh-caps=-all --bounding-set=-all -- "$@"
fi
exec "$@"
"""
_SETUP = _SETUP.replace("@PRIVATE_DIRS@", " ".join(PRIVATE_DIRS))

# The interpreter's first statements: refuse sockets from Python code (the only
# network barrier in process isolation; harmless in a network namespace).
_BOOT = r"""
import sys
def _no_network(event, args):
    if event.startswith("socket."):
        raise PermissionError("network access is disabled in the sandbox")
sys.addaudithook(_no_network)
del _no_network
sys.argv = ["main.py"]
import os
with open("main.py") as f:
    code = compile(f.read(), "main.py", "exec")
os.unlink("main.py")  # the program cannot read its own text (nor a token in it)
del sys, os, f
@PRELUDE@
exec(code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
"""

# `deterministic=True`: what a program could read that differs between two runs of the
# same code, fixed before it starts (with PYTHONHASHSEED=0 for str and bytes hashes, and
# TZ=UTC): `random`'s seed, os.urandom and os.getrandom, the time module's clocks (they
# advance 1 ms per read), local time, datetime's now and today; a CPU timer.
_DETERMINISTIC = r"""
import os as _os, random as _random, time as _time
_random.seed(0)
_bytes = _random.Random(1)
_os.urandom = lambda n: _bytes.randbytes(n)
_os.getrandom = lambda n, flags=0: _bytes.randbytes(n)
_now = [1_700_000_000.0]
def _tick():
    _now[0] += 0.001
    return _now[0]
_time.time = _tick
_time.time_ns = lambda: int(_tick() * 1e9)
_time.monotonic = _time.perf_counter = _time.process_time = lambda: _tick() - 1_700_000_000.0
_time.monotonic_ns = _time.perf_counter_ns = _time.process_time_ns = (
    lambda: int((_tick() - 1_700_000_000.0) * 1e9)
)
import signal as _signal
_signal.signal(_signal.SIGPROF, lambda *_: _os._exit(@TIMER_EXIT@))
_signal.setitimer(_signal.ITIMER_PROF, @CPU_TIMER_S@)
import datetime as _dt
class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(_tick(), tz)
    @classmethod
    def utcnow(cls):
        return cls.fromtimestamp(_tick(), _dt.timezone.utc).replace(tzinfo=None)
    @classmethod
    def today(cls):
        return cls.fromtimestamp(_tick())
class _FixedDate(_dt.date):
    @classmethod
    def today(cls):
        return cls.fromtimestamp(_tick())
_dt.datetime, _dt.date = _FixedDatetime, _FixedDate
_ctime, _strftime = _time.ctime, _time.strftime
_time.localtime = lambda t=None: _time.gmtime(_tick() if t is None else t)
_time.ctime = lambda t=None: _ctime(_tick() if t is None else t)
_time.asctime = lambda t=None: _time.strftime("%a %b %d %H:%M:%S %Y", _time.localtime() if t is None else t)
_time.strftime = lambda f, t=None: _strftime(f, _time.localtime() if t is None else t)
"""
TIMER_EXIT = 124  # deterministic mode: the program used its CPU time (`cpu_timer_s`)


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 4
    wall_s: float = 8.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 64
    open_files: int = 64
    output_bytes: int = 1 << 20
    tmpfs_mb: int = 64


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None: killed by the sandbox (see `killed`)
    stdout: str
    stderr: str
    killed: str | None  # "timeout" | "output" | "too-long" | None
    seconds: float
    token_seen: bool = False  # the harness's pass token came back (assert-style tests)

    @property
    def ok(self) -> bool:
        return self.killed is None and self.exit_code == 0


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the program's failure)."""


@functools.cache
def namespaces_available() -> str | None:
    """None when `unshare` gives this process the namespaces the sandbox uses,
    else why not."""
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "the setpriv command (util-linux) is not installed"
    hidden = _hidden_by_tmpfs()
    if hidden:
        return hidden
    try:
        r = subprocess.run([*_unshare_prefix(), "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if r.returncode != 0:
        return f"unshare was refused: {r.stderr.strip()[:200]}"
    return None


def resolve_isolation(isolation: str) -> str:
    """'namespace' or 'process' for a configured 'auto' | 'namespace' | 'process'."""
    if isolation == "process":
        return "process"
    why = namespaces_available()
    if why is None:
        return "namespace"
    if isolation == "namespace":
        raise SandboxError(f"code sandbox: namespace isolation is required but {why}")
    _warn_fallback(why)
    return "process"


@functools.cache
def _warn_fallback(why: str) -> None:
    log.warning(
        "code sandbox: %s; running model code with process isolation only "
        "(no network or filesystem isolation; see swarmrl/tasks/graders/sandbox.py)",
        why,
    )


def _unshare_prefix() -> list[str]:
    base = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
    if os.geteuid() != 0:
        base.insert(1, "--user")
        base.insert(2, "--map-root-user")
    return base


def _rlimits(limits: Limits) -> list[tuple[str, int, int, int]]:
    """(prlimit option, resource, soft, hard) for every limit the sandbox sets."""
    cpu = max(1, int(limits.cpu_s))
    mem, size = limits.memory_mb << 20, limits.file_mb << 20
    return [
        ("cpu", resource.RLIMIT_CPU, cpu, cpu + 1),
        ("as", resource.RLIMIT_AS, mem, mem),
        ("fsize", resource.RLIMIT_FSIZE, size, size),
        ("nproc", resource.RLIMIT_NPROC, limits.processes, limits.processes),
        ("nofile", resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        ("core", resource.RLIMIT_CORE, 0, 0),
    ]


def _limit_launch(limits: Limits) -> tuple[list[str], object]:
    """How the limits are applied: a `prlimit` prefix (util-linux), or, where it is
    missing, a preexec function (slower: it forces a full fork of the caller, which is
    large in a worker that holds a model)."""
    if shutil.which("prlimit"):
        opts = [f"--{name}={soft}:{hard}" for name, _, soft, hard in _rlimits(limits)]
        return ["prlimit", *opts, "--"], None

    def apply() -> None:
        for _, res, soft, hard in _rlimits(limits):
            resource.setrlimit(res, (soft, hard))

    return [], apply


def python_for_sandbox() -> str:
    """The interpreter itself, a virtual environment's link resolved: programs run
    with -I -S and want none of the environment's packages, and an environment
    inside /tmp (a checkout there) would be hidden by the sandbox's private /tmp."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _hidden_by_tmpfs() -> str | None:
    """Why the interpreter would not be reachable under the private tmpfs mounts."""
    for what, path in (
        ("interpreter", python_for_sandbox()),
        ("standard library", os.path.realpath(sysconfig.get_paths()["stdlib"])),
        ("installation", os.path.realpath(sys.base_prefix)),
        ("installation", os.path.realpath(sys.base_exec_prefix)),
    ):
        for d in PRIVATE_DIRS:
            if path == d or path.startswith(d + "/"):
                return f"the Python {what} ({path}) lies under {d}, which the sandbox replaces"
    return None


def run_python(
    code: str,
    stdin: str = "",
    limits: Limits = Limits(),
    isolation: str = "auto",
    token: str | None = None,
    deterministic: bool = False,
    cpu_timer_s: float | None = None,
) -> RunResult:
    """Run `code` as a Python program fed `stdin`; what it printed and how it ended.

    With `token`, the program's exit status is not trusted: `token_seen` says
    whether the token came back on a separate pipe (the caller's test code
    writes it there after its last assertion: see `assert_program`).

    `deterministic`: hash seed 0, a seeded `random` and os.urandom, clocks that
    only count their own reads (`_DETERMINISTIC`), so that two runs of most programs
    print the same bytes (the Python tool, envs/python_tool.py). Not covered:
    addresses (`id`, default reprs), /proc, and anything read through C.
    There a program that has used `cpu_timer_s` of CPU (default: `limits.cpu_s`)
    exits with status TIMER_EXIT, the same way in either isolation, before
    RLIMIT_CPU (set it higher) kills it."""
    if deterministic and token is not None:  # the prelude's functions reach the boot's globals
        raise ValueError("run_python: a pass token cannot be combined with deterministic mode")
    mode = resolve_isolation(isolation)
    source = code.encode()
    if len(source) > MAX_CODE_BYTES:
        return RunResult(None, "", f"program over {MAX_CODE_BYTES} bytes", "too-long", 0.0)
    work = tempfile.mkdtemp(prefix="swarmrl-sandbox-")
    read_fd = write_fd = None
    try:
        os.chmod(work, 0o755)
        path = os.path.join(work, "main.py")
        with open(path, "wb") as f:
            f.write(source)
        os.chmod(path, 0o644)
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/run", "LANG": "C.UTF-8"}
        if deterministic:
            # -I would ignore PYTHONHASHSEED: the same isolation from its parts (no
            # script directory or user site on the path), in an environment of our own
            timer = float(cpu_timer_s if cpu_timer_s is not None else limits.cpu_s)
            prelude = _DETERMINISTIC.replace("@TIMER_EXIT@", str(TIMER_EXIT))
            boot = _BOOT.replace("@PRELUDE@", prelude.replace("@CPU_TIMER_S@", repr(timer)))
            python = [python_for_sandbox(), "-P", "-s", "-S", "-c", boot]
            env["PYTHONHASHSEED"] = "0"
            env["TZ"] = "UTC"
        else:
            python = [python_for_sandbox(), "-I", "-S", "-c", _BOOT.replace("@PRELUDE@", "")]
        if mode == "namespace":
            size_kb = str(limits.tmpfs_mb << 10)
            cmd = [*_unshare_prefix(), "/bin/sh", "-c", _SETUP, "sh", work, "-", size_kb, *python]
            env["SANDBOX_DROP"] = "1"
            cwd = "/"
        else:
            cmd, cwd = python, work
            env["HOME"] = work
        pass_fds = ()
        if token is not None:
            read_fd, write_fd = os.pipe()
            # The pipe's number is told to the test code only (see assert_program).
            env["SANDBOX_RESULT_FD"] = str(write_fd)
            pass_fds = (write_fd,)
        return _communicate(cmd, cwd, env, stdin, limits, pass_fds, read_fd, write_fd, token)
    finally:
        if read_fd is not None:
            os.close(read_fd)  # the write end is _communicate's to close
        shutil.rmtree(work, ignore_errors=True)


def _communicate(cmd, cwd, env, stdin, limits, pass_fds, read_fd, write_fd, token) -> RunResult:
    start = time.monotonic()
    prefix, preexec = _limit_launch(limits)
    try:
        proc = subprocess.Popen(
            [*prefix, *cmd],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=pass_fds,
            close_fds=True,
        )
    except OSError as e:
        raise SandboxError(f"code sandbox: cannot start {cmd[0]}: {e}") from e
    finally:
        if write_fd is not None:
            os.close(write_fd)  # the child holds its copy
    # The input goes in from a thread: a program that never reads it must not
    # block the caller once the pipe's buffer is full.
    feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True)
    feeder.start()
    out, err, side = bytearray(), bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, out)
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, err)
    if read_fd is not None:
        sel.register(read_fd, selectors.EVENT_READ, side)
    deadline = start + limits.wall_s
    killed = None
    while sel.get_map() and killed is None:
        left = deadline - time.monotonic()
        if left <= 0:
            killed = "timeout"
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                continue
            key.data.extend(chunk)
            if len(key.data) > limits.output_bytes:
                killed = "output"
                del key.data[limits.output_bytes :]
                break
    sel.close()
    if killed is not None:
        _kill_group(proc.pid)
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        killed = killed or "timeout"
        _kill_group(proc.pid)
        code = proc.wait()
    _kill_group(proc.pid)  # anything it left behind in its group
    feeder.join(timeout=1.0)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    return RunResult(
        None if killed else code,
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        killed,
        time.monotonic() - start,
        token is not None and token.encode() in bytes(side),
    )


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the program exited or closed its input without reading it all


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def assert_program(solution: str, test: str) -> tuple[str, str]:
    """(program, token): the solution, then the test code, then a line that writes
    a fresh random token to the result pipe. The pipe's number is read from the
    environment and removed before the solution runs, so exiting early, or
    printing anything, never yields the token."""
    token = secrets.token_hex(16)
    program = (
        "import os as _sbx_os\n"
        "_sbx_fd = int(_sbx_os.environ.pop('SANDBOX_RESULT_FD'))\n"
        "del _sbx_os\n"
        f"{solution}\n\n"
        f"{test}\n\n"
        "import os as _sbx_os\n"
        f"_sbx_os.write(_sbx_fd, b'{token}')\n"
    )
    return program, token
