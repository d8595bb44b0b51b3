"""Taking an emulated network down (sim/netns.py): its names, stopping what it
started, removing its namespaces and cgroups, and sweeping what a run killed with
SIGKILL left behind (every name carries PREFIX and the creating process's id; a
name whose process is gone is swept, and whatever still runs in it is killed)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from swarmrl.procs import pid_alive

PREFIX = "srl"  # every namespace and cgroup sim/netns.py makes is named PREFIX<pid>-...
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
STOP_GRACE_S = 5.0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def owner(name: str) -> int | None:
    """The pid in a name sim/netns.py made (PREFIX<pid>-...), or None."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def namespaces() -> list[str]:
    """The names of the network namespaces on this machine."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep() -> list[str]:
    """Remove the namespaces and cgroups left by runs whose process is gone (a run
    killed with SIGKILL); returns what was removed."""
    gone = []
    for name in namespaces():
        pid = owner(name)
        if pid is not None and not pid_alive(pid):
            left = ip("netns", "pids", name, check=False).stdout.split()
            kill_all(int(p) for p in left)  # processes it started, still inside
            ip("netns", "del", name, check=False)
            gone.append(name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        pid = owner(name[:-1]) if name.endswith("h") else None
        if pid is not None and not pid_alive(pid):  # a host leg (attach_host)
            ip("link", "del", name, check=False)
            gone.append(name)
    for scratch in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):  # delay lines' tables
        pid = owner(scratch.name)
        if pid is not None and not pid_alive(pid):
            shutil.rmtree(scratch, ignore_errors=True)
            gone.append(str(scratch))
    if CGROUP_CPU.is_dir():
        for group in CGROUP_CPU.glob(f"{PREFIX}*"):
            pid = owner(group.name)
            if pid is not None and not pid_alive(pid):
                kill_all(int(p) for p in tasks(group))
                remove_cgroup(group)
                gone.append(str(group))
    return gone


def tasks(group: Path) -> list[str]:
    return [t for f in group.rglob("cgroup.procs") for t in f.read_text().split()]


def kill_all(pids) -> None:
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_GRACE_S
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)  # a killed process leaves its namespace and cgroup as it is reaped


def remove_cgroup(group: Path) -> None:
    for child in sorted(group.glob("*/"), reverse=True):
        if (child / "cgroup.procs").exists():
            remove_cgroup(child)
    with contextlib.suppress(OSError):
        group.rmdir()


def stop(p: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after STOP_GRACE_S; the group is killed
    even when its first process has ended, so that none of its children stays."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
