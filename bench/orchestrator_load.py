"""Orchestrator load benchmark: simulated nodes against one `swarmrl orchestrator`,
swept over node counts, on SQLite and on PostgreSQL.

What one level of the sweep does, for N nodes:
1. start a fresh orchestrator process (`python -m swarmrl orchestrator`, one
   uvicorn process, as an operator runs it) on a fresh database: a new run
   directory for SQLite, a new database on one local PostgreSQL server for
   the engine's whole sweep. A fresh process per level makes its peak RSS
   (VmHWM) and its table sizes belong to that level alone;
2. the trainer key opens step 1 and publishes version 0, so work can flow;
3. N nodes, each with its own ed25519 key, register with invitations the
   operator issued (not measured);
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

After the sweep, the goal's node count runs once more beside the hostile mix
(bench/orchestrator_hostile.py: 1,000 sybil registrations from one address
range at an even rate through the window, 50 slow-loris connections, 20
connections declaring 10^12-byte bodies, rollout bombs uploaded and opened in
the dashboard's viewer, a newcomer from another range), and the honest nodes'
p99 and errors are reported beside the clean level's (`hostile`), with the
bombs' refusals and decoding peaks in the orchestrator and, after the level,
in a validator's reader (bench/rollout_bombs.py). The hostile level is `met`
when the honest p99 is under 50 ms with no errors, the newcomer got work and
every bomb was refused by both.

Latency is measured client-side, from just before the request is handed to
aiohttp until its body is read: it includes queueing in the orchestrator's
event loop and the client's own overhead. The orchestrator's mean per route
(its /metrics histogram, over the window) is reported beside it, so a slow
client shows as a gap between the two. An error is any non-2xx answer or an
exception (timeout, dropped connection); the node goes on as a real worker
would.

The load generator is this process: one asyncio loop; the honest nodes share
out aiohttp sessions 16 to a loopback source address (127.0.1.1, 127.0.1.2,
...: the orchestrator caps open connections per client address, and real
nodes are machines of their own), each pool holding up to 32 connections
and keeping idle ones 3 s, under the orchestrator's 5 s idle timeout, so a
request is never sent on a connection the server is closing. The sybils
and the slow-loris connections come from addresses of their own. Signing happens per
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
- `register_work_bits=12`: the sybils solve their proofs of work before the
  window; the faucet keeps its defaults (the honest nodes hold invitations);
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
      [--engines sqlite,postgres] [--sybils 1000] [--loris 50] [--no-hostile]
      [--out bench/results/orchestrator_load.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import AsyncExitStack, nullcontext
from dataclasses import asdict
from pathlib import Path

import aiohttp
from nacl.signing import SigningKey
from yarl import URL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchproc import Proc, clean_env, free_port, rm_tree, status_kb, wait_port  # noqa: E402
from orchestrator_hostile import (  # noqa: E402
    Attack,
    Hostile,
    bomber,
    long_declared,
    newcomer,
    slow_loris,
    solve_all,
    summarize_attack,
    sybil_flood,
)
from orchestrator_machine import (  # noqa: E402
    PgServer,
    fresh_database,
    fsync_ms,
    ms,
    percentile,
    postgres_server,
    server_means,
    snapshot,
)
from orchestrator_nodes import (  # noqa: E402
    Load,
    Recorder,
    Swarm,
    heartbeat_loop,
    loop_lag,
    open_run,
    register_all,
    work_loop,
)
from rollout_bombs import bomb_set  # noqa: E402

from swarmrl.config import load_config  # noqa: E402
from swarmrl.protocol.identity import load_or_create_key, public_key_hex  # noqa: E402
from swarmrl.protocol.rollouts import Limits  # noqa: E402

GOAL_NODES = 1000
GOAL_P99_MS = 50.0
WORK_BITS = 12  # the sybils' proofs of work are solved before the window; 12 keeps it short
SATURATED_CPU = 0.8  # client CPU seconds per second above which it is the bottleneck
SATURATED_LAG_MS = 10.0  # client event-loop lag (p99) above which its timings are inflated
CONTENDED = 0.1  # share of the window the orchestrator's loop waited for a CPU
NODES_PER_ADDRESS = 16  # honest nodes sharing one loopback source address
POOL_PER_ADDRESS = 32  # their connection pool: under orchestrator.max_connections_per_client
SYBIL_ADDRESS = "127.0.200.1"  # the hostile mix's clients, apart from the honest ones
LORIS_ADDRESS = "127.0.200.2"
LONG_ADDRESS = "127.0.200.3"
NEWCOMER_ADDRESS = "127.0.201.1"  # another address range (ranges.py: loopback, one each)


def honest_addresses(n: int) -> list[str]:
    """Loopback source addresses for n honest nodes, NODES_PER_ADDRESS to each: the
    orchestrator caps connections per client address, and real nodes are machines of
    their own (127.0.0.0/8 is all loopback on Linux)."""
    count = max(1, -(-n // NODES_PER_ADDRESS))
    return [f"127.0.{1 + j // 250}.{1 + j % 250}" for j in range(count)]


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


async def drive(
    url: str, trainer: SigningKey, n: int, load: Load, pids: tuple, token: str,
    hostile: Hostile | None = None,
) -> dict:  # fmt: skip
    """Register n nodes, run them through the warm-up and the window (beside the hostile
    mix if `hostile`); the level's figures."""
    timeout = aiohttp.ClientTimeout(total=30.0)
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(
                        limit=POOL_PER_ADDRESS, keepalive_timeout=3.0, local_addr=(address, 0)
                    ),
                    timeout=timeout,
                )
            )
            for address in honest_addresses(n)
        ]
        session = sessions[0]
        rec = Recorder()
        swarm = Swarm(url, sessions, rec)
        async with session.get(url + "/v1/run") as r:
            swarm.run_id = (await r.json())["run_id"]
        await open_run(swarm, trainer)
        keys = [SigningKey.generate() for _ in range(n)]
        t0 = time.monotonic()
        registered = await register_all(swarm, keys, token)
        ramp = {"registered": registered, "registration_s": round(time.monotonic() - t0, 2)}
        if hostile is not None:  # the sybils' keys and proofs of work, before the clock runs
            async with session.get(url + "/v1/run") as r:
                bits = (await r.json())["register_work_bits"]
            sybils = [SigningKey.generate() for _ in range(hostile.sybils)]
            proofs = solve_all(swarm.run_id, sybils, bits)
            extra = [SigningKey.generate() for _ in range(2)]  # the bomber, the newcomer
            extra_proofs = solve_all(swarm.run_id, extra, bits)
            bombs = bomb_set(Limits.of_run(load_config(None, [])).max_rows) if hostile.bombs else {}
        rng = random.Random(n)
        begin = time.monotonic() + 0.2
        rec.start = begin + load.warmup_s
        rec.end = end = rec.start + load.seconds
        tasks = []
        for key in keys:
            beat_at, work_at = (begin + rng.uniform(0, load.heartbeat_s) for _ in range(2))
            tasks.append(heartbeat_loop(swarm, key, load, beat_at, end))
            tasks.append(work_loop(swarm, key, load, work_at, end, rng))
        attack = Attack()
        if hostile is not None:
            host, port = URL(url).host, URL(url).port
            tasks.append(
                slow_loris(host, port, hostile.loris, hostile.drip_s, end, attack, LORIS_ADDRESS)
            )
            tasks.append(
                sybil_flood(
                    url, swarm.run_id, sybils, proofs, rec.start, end, attack, SYBIL_ADDRESS
                )
            )
            if hostile.long_lengths:
                tasks.append(long_declared(host, port, hostile.long_lengths, end, attack,
                                           LONG_ADDRESS))  # fmt: skip
            if bombs:
                tasks.append(bomber(url, swarm.run_id, extra[0], extra_proofs[0], bombs, token,
                                    rec.start, end, attack, pids[0], SYBIL_ADDRESS))  # fmt: skip
            if hostile.newcomer:
                middle = rec.start + load.seconds / 2
                tasks.append(newcomer(url, swarm.run_id, extra[1], extra_proofs[1], middle,
                                      attack, NEWCOMER_ADDRESS))  # fmt: skip
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
    figures = {**ramp, **summarize(rec, load, lags, cpu, server)}
    if hostile is not None:
        figures["attack"] = summarize_attack(attack, hostile, load.seconds)
    return figures


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
        f"orchestrator.register_work_bits={WORK_BITS}",
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


def run_level(
    engine: str, n: int, work: Path, pg: PgServer | None, trainer, load: Load,
    hostile: Hostile | None = None,
) -> dict:  # fmt: skip
    """One orchestrator process, fresh state, n nodes (beside the hostile mix if
    `hostile`): the level's figures."""
    level_dir = work / f"{engine}-{n}{'-hostile' if hostile else ''}"
    database = fresh_database(pg, f"bench_{n}{'_hostile' if hostile else ''}") if pg else ""
    loadavg = os.getloadavg()[0]
    disk = fsync_ms(level_dir)
    proc, url = start_orchestrator(level_dir, database, public_key_hex(trainer), load)
    try:
        pids = (proc.p.pid, pg.pid if pg else None)
        token = (level_dir / "bench" / "keys" / "operator.token").read_text().strip()
        result = asyncio.run(drive(url, trainer, n, load, pids, token, hostile))
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


def sweep(
    engine: str, counts: list[int], work: Path, trainer, load: Load, hostile: Hostile | None
) -> dict:
    """Every node count on one engine; where p99 first crosses the goal; the goal's
    verdict; then the goal's node count again beside the hostile mix."""
    with postgres_server() if engine == "postgres" else nullcontext() as pg:
        levels = []
        for n in counts:
            levels.append(run_level(engine, n, work, pg, trainer, load))
            print(
                f"{engine} {n} nodes: {levels[-1]['requests_per_s']} req/s, "
                f"p99 {levels[-1]['p99_ms']} ms, {levels[-1]['errors']} errors",
                file=sys.stderr,
            )
        attacked = None
        if hostile is not None:
            attacked = run_level(engine, hostile.nodes, work, pg, trainer, load, hostile)
            print(
                f"{engine} {hostile.nodes} nodes, hostile mix: p99 {attacked['p99_ms']} ms, "
                f"{attacked['errors']} errors; {attacked['attack']}",
                file=sys.stderr,
            )
    validator = validator_reads() if hostile is not None and hostile.bombs else None
    crossed = next((lv["nodes"] for lv in levels if lv["p99_ms"] > GOAL_P99_MS), None)
    goal = next((lv for lv in levels if lv["nodes"] == GOAL_NODES), None)
    clean = next((lv for lv in levels if hostile and lv["nodes"] == hostile.nodes), None)
    verdict = None
    if goal is not None:
        verdict = {
            "met": goal["p99_ms"] < GOAL_P99_MS and goal["errors"] == 0,
            "p99_ms": goal["p99_ms"],
            "errors": goal["errors"],
            "client_saturated": goal["client_saturated"],
            "cpu_contention": goal["cpu_contention"],
        }
    out = {"levels": levels, "p99_over_50ms_at_nodes": crossed, "goal_1000_nodes": verdict}
    if attacked is not None:
        bombs = attacked["attack"]["bombs"]
        views = [b for b in bombs.values() if isinstance(b, dict)]
        out["hostile"] = {
            "nodes": hostile.nodes,
            "met": attacked["p99_ms"] < GOAL_P99_MS
            and attacked["errors"] == 0
            and attacked["attack"]["newcomer"].get("admitted", not hostile.newcomer)
            and all(b.get("refused") for b in views)
            and (validator is None or validator["all_refused"]),
            "newcomer_admitted": attacked["attack"]["newcomer"].get("admitted"),
            "bombs_refused_by_viewer": sum(1 for b in views if b.get("refused")),
            "bombs": len(views),
            "viewer_child_peak_max_mb": max(
                (b["child_peak_mb"] for b in views if b.get("child_peak_mb") is not None),
                default=None,
            ),
            "viewer_cap_mb": viewer_cap_mb(),
            "validator": validator,
            "honest_p99_ms": attacked["p99_ms"],
            "honest_errors": attacked["errors"],
            "clean_p99_ms": clean["p99_ms"] if clean else None,
            "clean_errors": clean["errors"] if clean else None,
            "p99_ratio_hostile_to_clean": round(attacked["p99_ms"] / clean["p99_ms"], 2)
            if clean and clean["p99_ms"]
            else None,
            **attacked["attack"],
            "level": attacked,
        }
    return out


def viewer_cap_mb() -> float:
    """The memory cap of the dashboard viewer's decoding child on the benchmark's run."""
    from swarmrl.orchestrator.dashboard import ROLLOUT_DECODED_BYTES
    from swarmrl.protocol.rollouts import decode_memory, decoded_budget

    budget = min(ROLLOUT_DECODED_BYTES, decoded_budget(Limits.of_run(load_config(None, []))))
    return round(decode_memory(budget) / 2**20, 1)


def validator_reads() -> dict:
    """The validator's side: bench/rollout_bombs.py reads every bomb as a validator of the
    default run does, in a process of its own (its peak memory is its own)."""
    import subprocess

    python = ROOT / ".venv" / "bin" / "python"
    out = subprocess.run(
        [str(python if python.exists() else sys.executable), str(ROOT / "bench" / "rollout_bombs.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=clean_env({}),
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"bench/rollout_bombs.py failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


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
    ap.add_argument("--sybils", type=int, default=1000, help="hostile mix: sybil registrations")
    ap.add_argument("--loris", type=int, default=50, help="hostile mix: slow-loris connections")
    ap.add_argument(
        "--hostile-nodes", type=int, default=GOAL_NODES, help="hostile mix: honest nodes"
    )
    ap.add_argument("--no-hostile", action="store_true", help="skip the hostile mix")
    ap.add_argument(
        "--long-lengths", type=int, default=20, help="hostile mix: declared 10^12-byte bodies"
    )
    args = ap.parse_args()
    hostile = (
        None
        if args.no_hostile
        else Hostile(args.hostile_nodes, args.sybils, args.loris, long_lengths=args.long_lengths)
    )
    warmup = args.heartbeat_s if args.warmup_s is None else args.warmup_s
    load = Load(args.heartbeat_s, args.file_s, args.file_kb * 1024, args.seconds, warmup)
    counts = [int(x) for x in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="orch-load-"))
    out: dict = {
        "machine_cpus": os.cpu_count(),
        "load": asdict(load),
        "goal": f"{GOAL_NODES} nodes, p99 < {GOAL_P99_MS:.0f} ms, no errors, clean and "
        "beside the hostile mix",
        "hostile": asdict(hostile) if hostile else None,
        "engines": {},
    }
    try:
        trainer = load_or_create_key(work / "trainer.key")
        for engine in args.engines.split(","):
            out["engines"][engine] = sweep(engine, counts, work, trainer, load, hostile)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
