"""Processes on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_started() -> float:
    """When this process started (Linux: /proc, its start in ticks after boot), or now
    where /proc cannot say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(x.split()[1]) for x in Path("/proc/stat").read_text().splitlines()
            if x.startswith("btime ")
        )  # fmt: skip
    except (OSError, ValueError, IndexError, StopIteration):  # recovered: not Linux
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK")
