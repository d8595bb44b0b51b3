"""Peers for the SHARDCAST benchmark: the published `shardcast` package (and, from
bench/nginx_curl.py, nginx + curl).

    .venv/bin/python bench/shardcast_peers.py [--mib 1024] [--workdir DIR] [--only NAME]

One checkpoint (random bytes) is broadcast to `clients` processes on loopback and timed
until every client holds the file. Two peers for swarmrl's own SHARDCAST live here:

run_published_shardcast -- PyPI `shardcast==0.3.2` (PrimeIntellect), same topology as
swarmrl's: one origin, `relays` middle nodes mirroring the origin, `clients` clients
downloading from the middle nodes. Every node is its own OS process running the
package's own classes (OriginServer via shardcast.initialize/broadcast, MiddleNode,
ClientNode) from an isolated venv (bench/.peers/venv, created on first use; its only
dependency is blake3, so no torch is ever pulled). We only call the package; nothing of
it is copied here.

How that package works (read from the 0.3.2 wheel): broadcast() blake3-hashes the file
and writes it into a new version folder `vN/` as 50 MB shard files, then appends
"vN: <blake3>|<n_shards>" to `distribution.txt`. Every server is a single-threaded
http.server (one request at a time, listen backlog 5, HTTP/1.0) bound to 0.0.0.0 (no
knob; we only ever connect to 127.0.0.1). A middle node polls its upstream's
distribution.txt every `check_interval` (default 30 s), copies it into its own served
folder at once (so it advertises a version before it holds any shard) and then fetches
all shards with up to SHARDCAST_MAX_CONCURRENT_DOWNLOADS (default 10) `wget` processes;
each shard is renamed into place when complete, so a middle node serves a shard as soon
as that shard is whole (store-and-forward per shard, not per byte). A client
(ClientNode.download_version) reads distribution.txt, fetches every shard the same way
(each try picks a server at random, weighted by an EMA of measured bandwidth times success
rate), concatenates the shards into the output file and checks its blake3. A shard a
middle node does not hold yet answers 404; the client then sleeps
SHARDCAST_FAST_RETRY_INTERVAL (default 2 s, 3 times), then SHARDCAST_SLOW_RETRY_INTERVAL
(default 15 s), and retries forever. The package has no client-side watch loop (the CLI
is one-shot); our client process polls until the version shows up, then calls
download_version(), as a trainer/inference loop using it would. It waits until *every*
middle node lists the version (a plain GET of each one's distribution.txt): each of the
two list_available_versions() calls inside download_version() asks one server at random,
and if that server does not list the version yet, download_version() either returns None
("No versions available") or falls into its shard-discovery mode, which asks for shards
1..10 and retries the missing ones forever (seen in testing with 6 shards). If
download_version() still returns None we call it again (up to 5 times, counted in
client_download_attempts).

Knobs and fairness decisions (defaults in brackets):
  * middle node check_interval = 0.25 s [30 s; the CLI accepts whole seconds only, the
    MiddleNode constructor takes any number, which we use];
  * client poll for a new version = 0.25 s [no loop in the package];
  * SHARDCAST_FAST_RETRY_INTERVAL = 1 and SHARDCAST_SLOW_RETRY_INTERVAL = 1 [2 s / 15 s]:
    integers only, so 1 s is the smallest non-busy wait;
  * SHARDCAST_MAX_CONCURRENT_DOWNLOADS = 2 (argument `max_concurrent_downloads`) [10]:
    the best we found. With 8 clients x 10 wget processes against single-threaded servers
    whose listen queue holds 5, hundreds of connections overflow the queue and wait for
    the SYN retry (>= 1 s). 1 GiB on the 2-core dev box: 10 -> 51 s and 78 s, 4 -> 48 s,
    2 -> 42 s twice, 1 -> 41-45 s;
  * shard size, HTTP timeout, retry counts: package defaults.
  * Every server must serve a file `data1.bin`: ShardDownloader() fetches it from each
    upstream when it starts (to /tmp/dummy.bin, a fixed path). We put a 1 MB file in
    every server folder, and start the middle nodes and clients one after another
    (each reports ready before the next starts) so these fixed-path downloads do not
    race; that start-up is not timed.
  * ClientNode writes distribution.txt to a fixed path next to its package folder, which
    processes sharing one install would race on (on real hosts each client has its own
    install). Each client therefore imports the package through its own symlink
    (<workdir>/client_i/pkg/shardcast -> the venv's shardcast): same code, private temp
    path.
Timing: t0 is taken in the origin process right before broadcast(), so it includes the
package's sharding and hashing. `seconds` runs from t0 until the last client's
download_version() returned a file that passed the package's own blake3 check;
`seconds_with_verify` until the last client had also checked the sha256 of its file
against the source (done in the client process right after the download).
`seconds_after_publish` runs from the end of broadcast(). Throughput is
clients * size / seconds / 1e6 (MB/s delivered to clients).

run_nginx_curl -- the practical limit: the Debian nginx (installed with apt-get if
missing) started by us with our own config in `workdir` (127.0.0.1 on a free port,
sendfile on, `daemon off`, pid, logs and temp paths in workdir, worker_processes auto),
serving the file to `clients` parallel `curl -s -o FILE` processes. `seconds` runs from
starting the curls until all exited; `seconds_with_verify` adds running `sha256sum` on
the clients' files (all in parallel) and checking them.

Both functions warm the page cache with the source file and call sync() before timing,
run every process in its own process group and kill the groups on the way out, and
delete the downloaded copies afterwards (keep=True keeps them). Peak RSS is VmHWM from
/proc (read by the process itself before exit, or by us right before we stop it);
*_tree_MB figures add child processes (wget), sampled every 0.2 s. On a 2-core machine
all processes compete for the CPU, which every system here suffers alike.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchproc import (  # noqa: E402
    MB,
    Proc,
    RssSampler,
    clean_env,
    free_port,
    listen_overflows,
    make_random_file,
    rm_tree,
    sha256_file,
    status_kb,
    warm_cache,
)
from nginx_curl import run_nginx_curl  # noqa: E402

PACKAGE = "shardcast==0.3.2"
PEERS_DIR = Path(__file__).resolve().parent / ".peers"

# Package knob defaults (shardcast/envs.py, middle_node.py in 0.3.2), reported with results.
PACKAGE_DEFAULTS = {
    "middle_check_interval_s": 30,
    "SHARDCAST_FAST_RETRY_INTERVAL": 2,
    "SHARDCAST_FAST_RETRY_ATTEMPTS": 3,
    "SHARDCAST_SLOW_RETRY_INTERVAL": 15,
    "SHARDCAST_RETRY_ATTEMPTS": 5,
    "SHARDCAST_MAX_CONCURRENT_DOWNLOADS": 10,
    "SHARDCAST_SHARD_SIZE": 50_000_000,
    "SHARDCAST_HTTP_TIMEOUT": 30,
}

# --- programs run by the package's venv python (they only call the package) ----------

ORIGIN_PROG = r"""
import json, sys, time
import shardcast
data_dir, port, src = sys.argv[1], int(sys.argv[2]), sys.argv[3]
shardcast.initialize(data_dir=data_dir, port=port)
print("READY", flush=True)
sys.stdin.readline()  # the benchmark says go
t0 = time.time()
version = shardcast.broadcast(src)
print(json.dumps({"version": version, "t_start": t0, "t_published": time.time()}), flush=True)
while True:
    time.sleep(3600)
"""

MIDDLE_PROG = r"""
import sys, time
from shardcast import MiddleNode
upstream, data_dir, port, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
MiddleNode([upstream], data_dir, port, check_interval=float(interval))
print("READY", flush=True)
while True:
    time.sleep(3600)
"""

CLIENT_PROG = r"""
import hashlib, json, os, resource, sys, time, urllib.request
import shardcast
from shardcast import ClientNode
servers, out_dir, out_file, version, poll, want_sha = sys.argv[1:7]
servers = servers.split(",")
assert shardcast.__file__.startswith(os.environ["PYTHONPATH"]), shardcast.__file__
client = ClientNode(servers, out_dir)
print("READY", flush=True)

def listed(server):  # does this server's distribution.txt list the version yet?
    try:
        with urllib.request.urlopen(server + "/distribution.txt", timeout=30) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return False
    return any(line.split(":", 1)[0].strip() == version for line in lines)

polls = 0
while not all(listed(s) for s in servers):
    polls += 1
    time.sleep(float(poll))
t_seen = time.time()
attempts = 0
while True:
    attempts += 1
    path = client.download_version(version, out_file)
    if path or attempts >= 5:
        break
    time.sleep(float(poll))
t_done = time.time()
ok = False
if path:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    ok = h.hexdigest() == want_sha
t_verified = time.time()
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0].split()[1]
print(json.dumps({
    "ok": ok, "downloaded": bool(path), "polls": polls, "attempts": attempts,
    "t_seen": t_seen, "t_done": t_done,
    "t_verified": t_verified, "vmhwm_kb": int(hwm),
    "children_maxrss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
sys.exit(0 if ok else 1)
"""


# --- the published package -------------------------------------------------------------


def ensure_package_venv(venv: Path = PEERS_DIR / "venv") -> tuple[Path, dict]:
    """A venv with exactly shardcast==0.3.2 (+ blake3, its only dependency)."""
    py = venv / "bin" / "python"
    probe = "import importlib.metadata as m; print(m.version('shardcast'), m.version('blake3'))"
    ok = py.exists() and subprocess.run([py, "-c", probe], capture_output=True, text=True)
    if not ok or ok.returncode != 0 or not ok.stdout.startswith("0.3.2 "):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", PACKAGE], check=True)
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True)
    sc_ver, b3_ver = out.stdout.split()
    pkg = subprocess.run(
        [py, "-c", "import os, shardcast; print(os.path.dirname(shardcast.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.strip()
    return py, {"shardcast": sc_ver, "blake3": b3_ver, "package_dir": pkg}


def _relay_done_time(log: Path) -> float | None:
    """Wall time of the middle node's 'Finished downloading all N shards' log line."""
    for line in log.read_text(errors="replace").splitlines():
        if "Finished downloading all" in line:
            stamp = line.split(" - ", 1)[0]
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _count_404s(middles: list[Proc]) -> int:
    """Shard requests answered 404 by the middle nodes (their DEBUG request log)."""
    n = 0
    for m in middles:
        n += sum('" 404 ' in line for line in m.log.read_text(errors="replace").splitlines())
    return n


def run_published_shardcast(
    src: Path,
    workdir: Path,
    clients: int = 8,
    relays: int = 2,
    *,
    max_concurrent_downloads: int = 2,
    poll_s: float = 0.25,
    timeout_s: float = 1800.0,
    log_level: str = "INFO",
    keep: bool = False,
) -> dict:
    """Broadcast `src` with PyPI shardcast 0.3.2: origin -> `relays` middle nodes -> clients.

    Returns seconds (broadcast start -> every client holds the file, package blake3 check
    passed), seconds_with_verify (+ our sha256 check per client), throughput_MBps, peak RSS
    of relays and clients, the knobs used and the package defaults.
    """
    src = Path(src).resolve()
    workdir = Path(workdir).resolve() / "published_shardcast"
    rm_tree(workdir)
    workdir.mkdir(parents=True)
    size = src.stat().st_size
    want_sha = sha256_file(src)
    py, versions = ensure_package_venv()

    knobs = {
        "middle_check_interval_s": poll_s,
        "client_version_poll_s": poll_s,
        "SHARDCAST_FAST_RETRY_INTERVAL": 1,
        "SHARDCAST_SLOW_RETRY_INTERVAL": 1,
        "SHARDCAST_MAX_CONCURRENT_DOWNLOADS": max_concurrent_downloads,
        "SHARDCAST_SHARD_SIZE": PACKAGE_DEFAULTS["SHARDCAST_SHARD_SIZE"],
    }
    env = clean_env(
        {
            "SHARDCAST_LOG_LEVEL": log_level,
            "SHARDCAST_FAST_RETRY_INTERVAL": str(knobs["SHARDCAST_FAST_RETRY_INTERVAL"]),
            "SHARDCAST_SLOW_RETRY_INTERVAL": str(knobs["SHARDCAST_SLOW_RETRY_INTERVAL"]),
            "SHARDCAST_MAX_CONCURRENT_DOWNLOADS": str(knobs["SHARDCAST_MAX_CONCURRENT_DOWNLOADS"]),
        }
    )

    procs: list[Proc] = []
    sampler = RssSampler()
    sampler.start()
    try:
        # Origin.
        origin_dir = workdir / "origin"
        origin_dir.mkdir()
        (origin_dir / "data1.bin").write_bytes(b"\0" * 1_000_000)
        origin_port = free_port()
        origin = Proc(
            "origin",
            [str(py), "-c", ORIGIN_PROG, str(origin_dir), str(origin_port), str(src)],
            workdir / "origin.log",
            env=env,
            cwd=workdir,
            stdin=True,
        )
        procs.append(origin)
        origin.wait_ready(60)
        sampler.watch(origin.p.pid, "origin")

        # Middle nodes, one at a time (see the module docstring: /tmp/dummy.bin).
        middles: list[Proc] = []
        for i in range(relays):
            d = workdir / f"middle_{i}"
            d.mkdir()
            (d / "data1.bin").write_bytes(b"\0" * 1_000_000)
            port = free_port()
            m = Proc(
                f"middle_{i}",
                [str(py), "-c", MIDDLE_PROG, f"http://127.0.0.1:{origin_port}", str(d)]
                + [str(port), str(poll_s)],
                workdir / f"middle_{i}.log",
                env=env,
                cwd=workdir,
            )
            m.port = port
            procs.append(m)
            middles.append(m)
            m.wait_ready(60)
            sampler.watch(m.p.pid, m.name)
        servers = ",".join(f"http://127.0.0.1:{m.port}" for m in middles)

        # Clients, one at a time, each through its own symlink to the package.
        cl: list[Proc] = []
        for i in range(clients):
            d = workdir / f"client_{i}"
            (d / "pkg").mkdir(parents=True)
            (d / "pkg" / "shardcast").symlink_to(versions["package_dir"])
            c = Proc(
                f"client_{i}",
                [str(py), "-c", CLIENT_PROG, servers, str(d / "out"), str(d / "checkpoint.bin")]
                + ["v1", str(poll_s), want_sha],
                workdir / f"client_{i}.log",
                env={**env, "PYTHONPATH": str(d / "pkg")},
                cwd=d,
            )
            procs.append(c)
            cl.append(c)
            c.wait_ready(60)
            sampler.watch(c.p.pid, c.name)

        warm_cache(src)
        overflows0 = listen_overflows()
        t_go = time.time()
        origin.p.stdin.write("go\n")
        origin.p.stdin.flush()

        deadline = time.monotonic() + timeout_s
        while any(c.p.poll() is None for c in cl):
            if time.monotonic() > deadline:
                raise TimeoutError(f"published shardcast: clients not done after {timeout_s} s")
            if origin.p.poll() is not None or any(m.p.poll() is not None for m in middles):
                raise RuntimeError(f"a shardcast server died; origin log:\n{origin.tail()}")
            for c in cl:
                if c.p.poll() is not None and c.p.returncode != 0:
                    raise RuntimeError(f"{c.name} exited {c.p.returncode}:\n{c.tail()}")
            time.sleep(0.1)
        overflows = listen_overflows() - overflows0
        for c in cl:
            c._reader.join(5)
        sampler.sample()
        relay_hwm = {m.name: status_kb(m.p.pid, "VmHWM") for m in middles}
        origin_hwm = status_kb(origin.p.pid, "VmHWM")

        pub = origin.json_line()
        rows = [c.json_line() for c in cl]
        bad = [c.name for c, r in zip(cl, rows, strict=True) if not r or not r["ok"]]
        if pub is None or bad:
            raise RuntimeError(f"published shardcast failed for {bad or 'origin'}: {cl[0].tail()}")

        t0 = pub["t_start"]
        t_done = max(r["t_done"] for r in rows)
        t_ver = max(r["t_verified"] for r in rows)
        relay_done = [_relay_done_time(m.log) for m in middles]
        seconds = t_done - t0
        mb = lambda kb: round(kb / 1024, 1)  # noqa: E731
        return {
            "system": f"shardcast {versions['shardcast']} (PyPI)",
            "seconds": round(seconds, 3),
            "seconds_with_verify": round(t_ver - t0, 3),
            "seconds_after_publish": round(t_done - pub["t_published"], 3),
            "publish_seconds": round(pub["t_published"] - t0, 3),
            "go_to_broadcast_start_s": round(t0 - t_go, 3),
            "relays_done_s": [round(t - t0, 3) if t else None for t in relay_done],
            "clients_done_s": sorted(round(r["t_done"] - t0, 3) for r in rows),
            "client_version_polls": [r["polls"] for r in rows],
            "client_download_attempts": [r["attempts"] for r in rows],
            "listen_queue_overflows": overflows,
            "throughput_MBps": round(clients * size / seconds / MB, 1),
            "peak_rss_relay_MB": mb(max(relay_hwm.values())),
            "peak_rss_client_MB": mb(max(r["vmhwm_kb"] for r in rows)),
            "peak_rss_origin_MB": mb(origin_hwm),
            "peak_rss_relay_tree_MB": mb(max(sampler.tree_kb[m.p.pid] for m in middles)),
            "peak_rss_client_tree_MB": mb(max(sampler.tree_kb.get(c.p.pid, 0) for c in cl)),
            "peak_rss_client_wget_MB": mb(max(r["children_maxrss_kb"] for r in rows)),
            "bytes": size,
            "clients": clients,
            "relays": relays,
            "knobs": knobs,
            "package_defaults": PACKAGE_DEFAULTS,
            "versions": {k: v for k, v in versions.items() if k != "package_dir"},
            **({"middle_404s": _count_404s(middles)} if log_level == "DEBUG" else {}),
            "notes": [
                "t0 = origin process right before shardcast.broadcast() (includes its blake3 "
                "hash and sharding copy); seconds: until the last client's download_version() "
                "returned (package blake3 check passed); seconds_with_verify: plus our sha256 "
                "check in each client.",
                "middle nodes advertise a version before holding shards; clients' 404s are "
                "retried after SHARDCAST_FAST/SLOW_RETRY_INTERVAL (integer seconds, set to 1).",
                "servers are single-threaded http.server (one request at a time, backlog 5); "
                "every shard is fetched by a separate wget process and written to disk, then "
                "clients concatenate shards into the output file (another full write) and "
                "read it back for blake3.",
                "peak_rss_*_MB: VmHWM of the node's python process (includes the file pages "
                "blake3 maps to hash the whole file, hence ~file size for origin and clients); "
                "*_tree_MB: summed RSS of the process and its wget children, sampled every "
                "0.2 s.",
                "listen_queue_overflows: connections the kernel dropped (client SYN retried "
                "after >= 1 s) because a server's listen queue (5) was full, whole machine, "
                "during the timed part.",
            ],
        }
    finally:
        sampler.stop()
        for p in reversed(procs):
            p.kill()
        if not keep:
            for p in workdir.glob("*"):
                if p.is_dir():
                    rm_tree(p)


# --- command line ----------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="checkpoint size in MiB")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/swarmrl_shardcast_peers"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--relays", type=int, default=2)
    ap.add_argument("--only", choices=["published", "nginx"])
    ap.add_argument(
        "--max-concurrent-downloads",
        type=int,
        default=2,
        help="SHARDCAST_MAX_CONCURRENT_DOWNLOADS for the package (ours: 2, package's: 10)",
    )
    ap.add_argument(
        "--poll",
        type=float,
        default=0.25,
        help="middle node check interval and client version poll, seconds",
    )
    ap.add_argument("--log-level", default="INFO", help="SHARDCAST_LOG_LEVEL for the package")
    ap.add_argument("--keep", action="store_true", help="keep downloaded copies")
    args = ap.parse_args()
    # A SIGTERM unwinds like an exception, so every `finally` stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    args.workdir.mkdir(parents=True, exist_ok=True)
    src = args.workdir / f"checkpoint_{args.mib}MiB.bin"
    if not src.exists() or src.stat().st_size != args.mib << 20:
        print(f"writing {args.mib} MiB of random bytes to {src}", file=sys.stderr)
        make_random_file(src, args.mib)
    out: dict = {
        "mib": args.mib,
        "clients": args.clients,
        "relays": args.relays,
        "cpus": os.cpu_count(),
    }
    if args.only in (None, "published"):
        print("running published shardcast ...", file=sys.stderr)
        out["published_shardcast"] = run_published_shardcast(
            src,
            args.workdir,
            args.clients,
            args.relays,
            max_concurrent_downloads=args.max_concurrent_downloads,
            poll_s=args.poll,
            log_level=args.log_level,
            keep=args.keep,
        )
    if args.only in (None, "nginx"):
        print("running nginx + curl ...", file=sys.stderr)
        out["nginx_curl"] = run_nginx_curl(src, args.workdir, args.clients, keep=args.keep)
    if "published_shardcast" in out and "nginx_curl" in out:
        out["ratio_published_over_nginx"] = round(
            out["published_shardcast"]["seconds"] / out["nginx_curl"]["seconds"], 2
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
