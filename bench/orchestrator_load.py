"""Orchestrator load benchmark: simulated nodes against one `swarmrl orchestrator`,
swept over node counts, on SQLite and on PostgreSQL.

What one level of the sweep does, for N nodes:
1. start a fresh orchestrator process (`python -m swarmrl orchestrator`, one
   uvicorn process, as an operator runs it) on a fresh database: a new run
   directory for SQLite, a new database on one local PostgreSQL server for
   the engine's whole sweep. A fresh process per level makes its peak RSS
   (VmHWM) and its table sizes belong to that level alone;
2. the trainer key opens step 1 and publishes version 0, so work can flow;
3. N nodes, each with its own ed25519 key, register (not measured);
4. load: every node heartbeats every `--heartbeat-s` (want_work=false, as the
   worker's background heartbeat does) from a random phase, and runs the
   worker's main loop: a heartbeat with want_work=true returns an
   assignment; `--file-s` later (±20%) the node asks for an upload URL, PUTs
   `--file-kb` of fresh random bytes to it and submits, then asks for work
   again. The first file of each node is already partly done (its delay is
   uniform in [0, file-s)), so uploads arrive at their steady rate N/file-s
   from the first seconds instead of all after one full file time;
5. measured: the `--seconds` after a warm-up of one heartbeat interval (by
   then every node has its first assignment). A request belongs to the
   window if it started inside it.

Latency is measured client-side, from just before the request is handed to
aiohttp until its body is read: it includes queueing in the orchestrator's
event loop and the client's own overhead. The orchestrator's mean per route
(its /metrics histogram, over the window) is reported beside it, so a slow
client shows as a gap between the two. An error is any non-2xx answer or an
exception (timeout, dropped connection); the node goes on as a real worker
would.

The load generator is this process: one asyncio loop, one aiohttp session
whose pool holds up to one connection per node (as real nodes would) and
keeps idle connections 3 s, under uvicorn's 5 s keep-alive, so a request is
never sent on a connection the server is closing. Signing happens per
request with a fresh nonce and timestamp; nothing is pre-computed but the
keys. On a 2-core machine the client competes with the orchestrator (and
PostgreSQL, and whatever else runs) for CPU. Each level reports the client's
CPU seconds (`client_saturated`: it used most of a core), its event-loop lag,
and how long the orchestrator's and the client's event loops waited in the
kernel's run queue (/proc/PID/schedstat); `cpu_contention` is set when the
orchestrator waited for a CPU over 10% of the window or the client's loop
lagged: then the latencies measure the machine's load as much as the
orchestrator, and the 1-minute load average before the level says whether
other work was running.

Settings chosen for the benchmark, not for realism of the run:
- `validator.enabled=false`: submitted files are accepted directly;
- `worker.max_pending_groups=1000000`: the orchestrator never answers
  "enough-work" (`trainer.batch_groups` is capped at 100000 by its config,
  and this limit takes precedence over it anyway);
- `orchestrator.uploads_per_minute=1000`: the rate limit is not tested here;
- `orchestrator.probation_files=0` and `min_assignment_s=600`: every node is
  proven and has the flat 600 s deadline (admission is tested apart:
  tests/unit/test_orchestrator_admission.py);
- `unhealthy_after_s` and `dead_after_s` at 3x and 9x the heartbeat interval
  (their defaults assume a 2 s heartbeat), so the jitter of a 10 s heartbeat
  does not make nodes unhealthy;
- each engine as the orchestrator configures it: SQLite with
  synchronous=NORMAL in WAL mode (a commit is not fsynced; a killed process
  loses nothing, a power loss may lose the last commits), PostgreSQL with its
  default durability (synchronous_commit on: an fsync of the WAL per
  commit). Each level first measures what an fsync costs on this disk right
  then (`disk_fsync_ms_before`), which other work on the machine moves.

Usage:
  .venv/bin/python bench/orchestrator_load.py [--nodes 250,500,1000,2000] [--seconds 30]
      [--engines sqlite,postgres] [--out bench/results/orchestrator_load.json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import pwd
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
from nacl.signing import SigningKey
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchproc import Proc, clean_env, free_port, process_tree, rm_tree, status_kb, wait_port  # noqa: E402

from swarmrl.protocol.identity import load_or_create_key, public_key_hex  # noqa: E402
from swarmrl.protocol.signing import sign_request  # noqa: E402

HARDWARE = {"cpus": 4, "memory_gb": 16.0, "tokens_per_s": 500.0}
GOAL_NODES = 1000
GOAL_P99_MS = 50.0
SATURATED_CPU = 0.8  # client CPU seconds per second above which it is the bottleneck
SATURATED_LAG_MS = 10.0  # client event-loop lag (p99) above which its timings are inflated
CONTENDED = 0.1  # share of the window the orchestrator's loop waited for a CPU
METRIC = re.compile(r'^swarmrl_request_seconds_(sum|count)\{route="([^"]*)"\} (\S+)$')


@dataclass(frozen=True)
class Load:
    """What each simulated node does, and for how long it is measured."""

    heartbeat_s: float
    file_s: float
    file_bytes: int
    seconds: float
    warmup_s: float


@dataclass
class Recorder:
    """Client-side timings and errors of the requests that start inside [start, end)."""

    start: float = math.inf
    end: float = math.inf
    latency: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    outside_errors: int = 0
    waits: Counter = field(default_factory=Counter)
    assignments: int = 0

    def add(self, endpoint: str, t0: float, seconds: float, error: str | None) -> None:
        if not self.start <= t0 < self.end:
            self.outside_errors += error is not None
            if error is not None and len(self.examples) < 5:
                self.examples.append(f"(outside the window) {endpoint}: {error}")
            return
        self.latency.setdefault(endpoint, []).append(seconds)
        if error is not None:
            self.errors[endpoint] += 1
            if len(self.examples) < 10:
                self.examples.append(f"{endpoint}: {error}")


class Swarm:
    """The simulated nodes' side of HTTP: one session, signed JSON calls, timing."""

    def __init__(self, url: str, session: aiohttp.ClientSession, rec: Recorder):
        self.url = url
        self.session = session
        self.rec = rec
        self.run_id = ""

    async def send(self, endpoint: str, method: str, url, **kw) -> tuple[int, bytes]:
        """(status, body) of one request, timed and recorded; status 0: no answer."""
        t0 = time.monotonic()
        try:
            async with self.session.request(method, url, **kw) as r:
                raw, status = await r.read(), r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            # Recovered: counted as an error; the node carries on as a worker would.
            raw, status = f"{type(e).__name__}: {e}".encode(), 0
        ok = 200 <= status < 300
        error = None if ok else f"{status} {raw[:160].decode(errors='replace')}"
        self.rec.add(endpoint, t0, time.monotonic() - t0, error)
        return status, raw

    async def call(self, key: SigningKey, endpoint: str, path: str, body: dict):
        """(status, answer) of a signed POST; answer is None unless the status is 2xx."""
        content = json.dumps(body).encode()
        headers = sign_request(key, self.run_id, "POST", path, content)
        headers["Content-Type"] = "application/json"
        status, raw = await self.send(
            endpoint, "POST", self.url + path, data=content, headers=headers
        )
        return status, json.loads(raw) if 200 <= status < 300 else None

    async def put(self, url: str, data: bytes) -> bool:
        status, _ = await self.send("PUT /objects", "PUT", URL(url, encoded=True), data=data)
        return 200 <= status < 300

    async def register(self, key: SigningKey) -> bool:
        body = {"role": "worker", "hardware": HARDWARE}
        status, _ = await self.call(key, "register", "/v1/nodes/register", body)
        return status == 200


async def sleep_until(t: float, end: float) -> bool:
    """Sleep until monotonic time `t`; False (at once) when `t` is past `end`."""
    if t >= end:
        return False
    await asyncio.sleep(max(0.0, t - time.monotonic()))
    return True


async def heartbeat_loop(swarm: Swarm, key: SigningKey, load: Load, t: float, end: float):
    """The worker's background heartbeat, from time `t` on."""
    body = {"policy_version": 0, "want_work": False}
    while await sleep_until(t, end):
        status, _ = await swarm.call(key, "heartbeat", "/v1/nodes/heartbeat", body)
        if status == 409:  # declared dead: join again, as the worker does
            await swarm.register(key)
        t += load.heartbeat_s


async def work_loop(swarm: Swarm, key: SigningKey, load: Load, t: float, end: float, rng):
    """The worker's main loop: ask for work, 'generate' for file_s, upload, submit."""
    body = {"policy_version": 0, "want_work": True}
    first = True
    while await sleep_until(t, end):
        _, hb = await swarm.call(key, "heartbeat want_work", "/v1/nodes/heartbeat", body)
        if hb is None or hb["assignment"] is None:
            if hb is not None:
                swarm.rec.waits[hb["wait"]] += 1
            t = time.monotonic() + load.heartbeat_s
            continue
        swarm.rec.assignments += swarm.rec.start <= time.monotonic() < swarm.rec.end
        spread = rng.uniform(0.0, 1.0) if first else rng.uniform(0.8, 1.2)
        first = False
        if not await sleep_until(time.monotonic() + spread * load.file_s, end):
            return
        await upload(swarm, key, hb["assignment"]["counter"], os.urandom(load.file_bytes))
        t = time.monotonic()


async def upload(swarm: Swarm, key: SigningKey, counter: int, data: bytes) -> None:
    sha = hashlib.sha256(data).hexdigest()
    body = {"counter": counter, "size": len(data), "sha256": sha}
    _, grant = await swarm.call(key, "uploads", "/v1/uploads", body)
    if grant is None or not await swarm.put(grant["url"], data):
        return
    await swarm.call(key, "submit", "/v1/submit", {"key": grant["key"], "sha256": sha})


async def loop_lag(end: float, rec: Recorder, out: list[float], period: float = 0.05) -> None:
    """How late the event loop wakes a sleeper, inside the window: the client's own delay."""
    while time.monotonic() < end:
        t = time.monotonic()
        await asyncio.sleep(period)
        if t >= rec.start:
            out.append(time.monotonic() - t - period)


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


def summarize(rec: Recorder, load: Load, lags: list[float], cpu: dict, server: dict) -> dict:
    """One level's figures (CPU and server means are deltas over the window)."""
    every = [x for xs in rec.latency.values() for x in xs]
    endpoints = {
        name: {
            "count": len(xs),
            "per_s": round(len(xs) / load.seconds, 1),
            "p50_ms": ms(percentile(xs, 0.5)),
            "p99_ms": ms(percentile(xs, 0.99)),
            "max_ms": ms(max(xs)),
            "errors": rec.errors[name],
        }
        for name, xs in sorted(rec.latency.items())
    }
    client_frac = cpu["client"] / load.seconds
    lag_p99 = ms(percentile(lags, 0.99))
    return {
        "requests": len(every),
        "requests_per_s": round(len(every) / load.seconds, 1),
        "p50_ms": ms(percentile(every, 0.5)),
        "p99_ms": ms(percentile(every, 0.99)),
        "max_ms": ms(max(every)) if every else None,
        "errors": sum(rec.errors.values()),
        "errors_outside_window": rec.outside_errors,
        "error_examples": rec.examples,
        "endpoints": endpoints,
        "server_mean_ms": {
            route: ms(s / n)
            for route, (s, n) in sorted(server.items())
            if n > 0 and route != "/metrics"
        },
        "assignments": rec.assignments,
        "waits": dict(rec.waits),
        "orchestrator_cpu_s": round(cpu["orchestrator"], 2),
        "orchestrator_cpu_per_s": round(cpu["orchestrator"] / load.seconds, 3),
        "orchestrator_cpu_ms_per_request": ms(cpu["orchestrator"] / max(1, len(every))),
        "postgres_cpu_s": round(cpu["postgres"], 2),
        "client_cpu_s": round(cpu["client"], 2),
        "client_cpu_per_s": round(client_frac, 3),
        "client_loop_lag_p99_ms": lag_p99,
        "client_saturated": client_frac > SATURATED_CPU,
        "orchestrator_waited_for_cpu_s": round(cpu["orchestrator_wait"], 2),
        "client_waited_for_cpu_s": round(cpu["client_wait"], 2),
        "cpu_contention": cpu["orchestrator_wait"] > CONTENDED * load.seconds
        or lag_p99 > SATURATED_LAG_MS,
    }


async def register_all(swarm: Swarm, keys: list[SigningKey], parallel: int = 32) -> int:
    """Register every key, `parallel` at a time; how many were admitted."""
    gate = asyncio.Semaphore(parallel)

    async def one(key: SigningKey) -> bool:
        async with gate:
            return await swarm.register(key)

    return sum(await asyncio.gather(*(one(k) for k in keys)))


async def open_run(swarm: Swarm, trainer: SigningKey) -> None:
    """The trainer opens step 1 with version 0 published; work can be assigned."""
    for endpoint, path, body in (
        ("trainer step", "/v1/trainer/step", {"step": 1}),
        ("trainer published", "/v1/trainer/published", {"version": 0}),
    ):
        status, _ = await swarm.call(trainer, endpoint, path, body)
        if status != 200:
            raise RuntimeError(f"{path} answered {status}: {swarm.rec.examples[-1:]}")


async def drive(url: str, trainer: SigningKey, n: int, load: Load, pids: tuple) -> dict:
    """Register n nodes, run them through the warm-up and the window; the level's figures."""
    connector = aiohttp.TCPConnector(limit=max(64, n), keepalive_timeout=3.0)
    timeout = aiohttp.ClientTimeout(total=30.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        rec = Recorder()
        swarm = Swarm(url, session, rec)
        async with session.get(url + "/v1/run") as r:
            swarm.run_id = (await r.json())["run_id"]
        await open_run(swarm, trainer)
        keys = [SigningKey.generate() for _ in range(n)]
        t0 = time.monotonic()
        registered = await register_all(swarm, keys)
        ramp = {"registered": registered, "registration_s": round(time.monotonic() - t0, 2)}
        rng = random.Random(n)
        begin = time.monotonic() + 0.2
        rec.start = begin + load.warmup_s
        rec.end = end = rec.start + load.seconds
        tasks = []
        for key in keys:
            beat_at, work_at = (begin + rng.uniform(0, load.heartbeat_s) for _ in range(2))
            tasks.append(heartbeat_loop(swarm, key, load, beat_at, end))
            tasks.append(work_loop(swarm, key, load, work_at, end, rng))
        lags: list[float] = []
        running = asyncio.gather(*tasks, loop_lag(end, rec, lags))
        await asyncio.sleep(max(0.0, rec.start - time.monotonic()))
        cpu0, server0 = snapshot(*pids), await server_means(session, url)
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        cpu1, server1 = snapshot(*pids), await server_means(session, url)
        await running  # every request has its own timeout
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    server = {
        route: [s - server0.get(route, [0.0, 0.0])[0], c - server0.get(route, [0.0, 0.0])[1]]
        for route, (s, c) in server1.items()
        if server0  # both ends of the window, or nothing
    }
    return {**ramp, **summarize(rec, load, lags, cpu, server)}


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


def start_orchestrator(work: Path, database: str, trainer_pub: str, load: Load) -> tuple[Proc, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    hb = load.heartbeat_s
    overrides = [
        f"runs_dir={json.dumps(str(work))}",
        'name="bench"',
        f"orchestrator.port={port}",
        f"orchestrator.url={json.dumps(url)}",
        f"orchestrator.trainer_keys=[{json.dumps(trainer_pub)}]",
        f"orchestrator.database={json.dumps(database)}",
        f"orchestrator.heartbeat_s={hb}",
        f"orchestrator.unhealthy_after_s={3 * hb}",
        f"orchestrator.dead_after_s={9 * hb}",
        "orchestrator.uploads_per_minute=1000",
        "worker.max_pending_groups=1000000",
        "validator.enabled=false",
        "orchestrator.probation_files=0",  # simulated nodes are proven from the start
        "orchestrator.min_assignment_s=600",  # the flat deadline they were measured with
        "orchestrator.register_work_bits=0",  # measured: the server, not the nodes' hashing
        "orchestrator.faucet_burst=1000000",
    ]
    python = ROOT / ".venv" / "bin" / "python"
    cmd = [str(python if python.exists() else sys.executable), "-m", "swarmrl", "orchestrator"]
    work.mkdir(parents=True, exist_ok=True)
    proc = Proc(
        "orchestrator",
        cmd + overrides,
        work / "orchestrator.log",
        env=clean_env({"PYTHONUNBUFFERED": "1"}),
        cwd=ROOT,
    )
    try:
        wait_port(port, timeout=60.0)
    except RuntimeError:
        proc.kill()
        raise RuntimeError(f"the orchestrator did not start; log tail:\n{proc.tail()}") from None
    return proc, url


def run_level(engine: str, n: int, work: Path, pg: PgServer | None, trainer, load: Load) -> dict:
    """One orchestrator process, fresh state, n nodes: the level's figures."""
    level_dir = work / f"{engine}-{n}"
    database = fresh_database(pg, f"bench_{n}") if pg else ""
    loadavg = os.getloadavg()[0]
    disk = fsync_ms(level_dir)
    proc, url = start_orchestrator(level_dir, database, public_key_hex(trainer), load)
    try:
        pids = (proc.p.pid, pg.pid if pg else None)
        result = asyncio.run(drive(url, trainer, n, load, pids))
        if proc.p.poll() is not None:
            raise RuntimeError(f"the orchestrator exited; log tail:\n{proc.tail()}")
        rss_kb = status_kb(proc.p.pid, "VmHWM") or 0
    finally:
        proc.kill()
        rm_tree(level_dir)
    return {
        "nodes": n,
        "loadavg_1m_before": round(loadavg, 2),
        "disk_fsync_ms_before": disk,
        **result,
        "orchestrator_peak_rss_mb": round(rss_kb / 1024, 1),
    }


def sweep(engine: str, counts: list[int], work: Path, trainer, load: Load) -> dict:
    """Every node count on one engine; where p99 first crosses the goal; the goal's verdict."""
    with postgres_server() if engine == "postgres" else nullcontext() as pg:
        levels = []
        for n in counts:
            levels.append(run_level(engine, n, work, pg, trainer, load))
            print(
                f"{engine} {n} nodes: {levels[-1]['requests_per_s']} req/s, "
                f"p99 {levels[-1]['p99_ms']} ms, {levels[-1]['errors']} errors",
                file=sys.stderr,
            )
    crossed = next((lv["nodes"] for lv in levels if lv["p99_ms"] > GOAL_P99_MS), None)
    goal = next((lv for lv in levels if lv["nodes"] == GOAL_NODES), None)
    verdict = None
    if goal is not None:
        verdict = {
            "met": goal["p99_ms"] < GOAL_P99_MS and goal["errors"] == 0,
            "p99_ms": goal["p99_ms"],
            "errors": goal["errors"],
            "client_saturated": goal["client_saturated"],
            "cpu_contention": goal["cpu_contention"],
        }
    return {"levels": levels, "p99_over_50ms_at_nodes": crossed, "goal_1000_nodes": verdict}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="250,500,1000,2000", help="node counts to sweep")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured seconds per level")
    ap.add_argument("--engines", default="sqlite,postgres")
    ap.add_argument("--heartbeat-s", type=float, default=10.0)
    ap.add_argument("--file-s", type=float, default=60.0, help="seconds between a node's files")
    ap.add_argument("--file-kb", type=int, default=16, help="size of each uploaded file")
    ap.add_argument("--warmup-s", type=float, default=None, help="default: one heartbeat")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    warmup = args.heartbeat_s if args.warmup_s is None else args.warmup_s
    load = Load(args.heartbeat_s, args.file_s, args.file_kb * 1024, args.seconds, warmup)
    counts = [int(x) for x in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="orch-load-"))
    out: dict = {
        "machine_cpus": os.cpu_count(),
        "load": asdict(load),
        "goal": f"{GOAL_NODES} nodes, p99 < {GOAL_P99_MS:.0f} ms, no errors",
        "engines": {},
    }
    try:
        trainer = load_or_create_key(work / "trainer.key")
        for engine in args.engines.split(","):
            out["engines"][engine] = sweep(engine, counts, work, trainer, load)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
