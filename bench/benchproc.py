"""Process plumbing shared by the benchmark peers: ports, processes, RSS, files.

Nothing here is specific to one system under test; bench/shardcast_peers.py and
bench/nginx_curl.py use it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from swarmrl.launch.supervisor import free_port  # noqa: F401  (the benchmarks import it from here)
from swarmrl.models.loading import file_sha256

MB = 1e6


sha256_file = file_sha256  # the benchmarks' name for it


def make_random_file(path: Path, mib: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    return path


def warm_cache(path: Path) -> None:
    """Read the file once (page cache) and flush dirty pages, so no run pays for another."""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass
    os.sync()


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Our environment without proxy settings (everything here is loopback)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


def listen_overflows() -> int:
    """Kernel-wide count of connections dropped because a listen queue was full."""
    with open("/proc/net/netstat") as f:
        lines = [ln.split() for ln in f if ln.startswith("TcpExt:")]
    return int(dict(zip(lines[0][1:], lines[1][1:], strict=True))["ListenOverflows"])


def status_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def process_tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        p = pids[i]
        i += 1
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    pids.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return pids


class RssSampler(threading.Thread):
    """Every `period` s: VmHWM of each watched pid, and the summed VmRSS of its process tree."""

    def __init__(self, period: float = 0.2):
        super().__init__(daemon=True)
        self.period = period
        self.pids: dict[int, str] = {}
        self.hwm_kb: dict[int, int] = {}
        self.tree_kb: dict[int, int] = {}
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def watch(self, pid: int, name: str) -> None:
        with self._lock:
            self.pids[pid] = name

    def sample(self) -> None:
        with self._lock:
            pids = list(self.pids)
        for pid in pids:
            hwm = status_kb(pid, "VmHWM")
            if hwm is not None:
                self.hwm_kb[pid] = max(hwm, self.hwm_kb.get(pid, 0))
            total = sum(status_kb(p, "VmRSS") or 0 for p in process_tree(pid))
            self.tree_kb[pid] = max(total, self.tree_kb.get(pid, 0))

    def run(self) -> None:
        while not self._stop_event.wait(self.period):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()


class Proc:
    """A subprocess in its own process group; stdout lines collected, stderr to a log file."""

    def __init__(self, name: str, cmd: list[str], log: Path, env=None, cwd=None, stdin=False):
        self.name = name
        self.log = log
        self._logf = open(log, "wb")
        self.p = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._logf,
            env=env,
            cwd=cwd,
            start_new_session=True,
            text=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            line = line.strip()
            if line == "READY":
                self.ready.set()
            elif line:
                self.lines.append(line)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start; log tail:\n{self.tail()}")

    def json_line(self) -> dict | None:
        for line in reversed(self.lines):
            if line.startswith("{"):
                return json.loads(line)
        return None

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
                self.p.wait(grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
        else:  # the leader is gone; make sure nothing of its group lingers (wget)
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.p.stdout:
            self.p.stdout.close()
        if self.p.stdin:
            self.p.stdin.close()
        self._logf.close()


def rm_tree(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def find_pid(role_arg: str, under: str) -> int | None:
    """A swarmrl process whose command line has `role_arg` as one argument and names a
    path under `under` (its run's directory): how a benchmark or a test finds one
    process of a swarm that a launcher started."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [c.decode(errors="replace") for c in cmd]
        if "swarmrl" in text and role_arg in text and any(under in c for c in text):
            return int(d.name)
    return None


def interrupt_group(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """Ctrl-C to a launcher started in its own session, as a person stops it; killed
    with its group if it is still there after `grace` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
