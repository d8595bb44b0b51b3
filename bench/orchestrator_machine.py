"""The machine under bench/orchestrator_load.py: CPU seconds and run-queue waits of
the processes, the orchestrator's own per-route means, the disk's fsync time, and a
throwaway PostgreSQL server."""

from __future__ import annotations

import math
import os
import pwd
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from benchproc import free_port, process_tree

METRIC = re.compile(r'^swarmrl_request_seconds_(sum|count)\{route="([^"]*)"\} (\S+)$')


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def runqueue_wait_s(pid: int | str) -> float:
    """Seconds the main thread of `pid` was ready to run but waited for a CPU."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0


def snapshot(orchestrator: int, postgres: int | None) -> dict:
    """Cumulative CPU seconds of the orchestrator, the PostgreSQL server tree and us,
    and the run-queue waits of the orchestrator's and our event loops."""
    pg = sum(cpu_s(p) for p in process_tree(postgres)) if postgres else 0.0
    return {
        "orchestrator": cpu_s(orchestrator),
        "postgres": pg,
        "client": client_cpu_s(),
        "orchestrator_wait": runqueue_wait_s(orchestrator),
        "client_wait": runqueue_wait_s("self"),
    }


async def server_means(session: aiohttp.ClientSession, url: str) -> dict[str, list[float]]:
    """Per route: [sum of seconds, count] from the orchestrator's /metrics; empty when
    an overloaded orchestrator does not answer in time (the level still reports)."""
    try:
        async with session.get(url + "/metrics") as r:
            text = await r.text()
    except (TimeoutError, aiohttp.ClientError) as e:
        print(f"  /metrics unanswered ({type(e).__name__}): no server-side means", flush=True)
        return {}
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m:
            out.setdefault(m.group(2), [0.0, 0.0])[m.group(1) == "count"] = float(m.group(3))
    return out


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else float("nan")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@dataclass(frozen=True)
class PgServer:
    url: str  # without a database name
    pid: int  # the postmaster


@contextmanager
def postgres_server() -> Iterator[PgServer]:
    """A local PostgreSQL server (initdb + pg_ctl on a loopback port) with default
    durability. PostgreSQL refuses to run as root; as root it runs as `postgres`."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    as_user: list[str] = []
    d = Path(tempfile.mkdtemp(prefix="orch-load-pg-"))  # not under `work`: postgres must reach it
    if os.geteuid() == 0:
        pg = pwd.getpwnam("postgres")
        os.chown(d, pg.pw_uid, pg.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = d / "data"
    subprocess.run(
        [*as_user, initdb, "-D", str(data), "-U", "swarm", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    opts = f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c max_connections=50"
    subprocess.run(
        [*as_user, pg_ctl, "-D", str(data), "-l", str(d / "log"), "-w", "-o", opts, "start"],
        check=True,
        capture_output=True,
    )
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        yield PgServer(f"postgresql://swarm@127.0.0.1:{port}", pid)
    finally:
        subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(d, ignore_errors=True)


def fsync_ms(directory: Path, n: int = 50) -> dict:
    """Latency of appending 4 KiB to a file and fsyncing it, n times: what one durable
    commit costs on this disk at this moment (other work on the machine changes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(n):
            os.write(fd, os.urandom(4096))
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50": ms(percentile(times, 0.5)), "p90": ms(percentile(times, 0.9))}


def fresh_database(server: PgServer, name: str) -> str:
    import psycopg

    with psycopg.connect(server.url + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{server.url}/{name}"
