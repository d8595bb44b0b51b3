"""SHARDCAST broadcast benchmark: 1 GiB to 8 clients through 2 relays, on loopback.

Three systems, side by side in one run, each moving the same file of random
bytes:
- swarmrl: `swarmrl origin` serving a signed version, 2 `swarmrl relay`
  processes following it, 8 `swarmrl fetch` processes following both relays.
  Everything is started and long-polling first; the clock starts when the
  version appears in the origin's directory (an atomic rename of a directory
  prepared and hashed beforehand: the trainer's hashing is not part of the
  broadcast) and stops when the last client has written the verified file
  (every shard checked against the signed manifest) and exited.
- the published `shardcast` package 0.3.2, same topology (bench/shardcast_peers.py);
- nginx serving the file directly to 8 parallel curl downloads: the practical
  limit of this machine's loopback and disk (bench/nginx_curl.py).

Prints one JSON object: seconds, throughput (client bytes / s), peak RSS of
relays and clients, CPU seconds per process, and the ratios.

Reading the figures on this VM: writing into page-cache memory that the host
has not backed lately costs about 2.5 s of system time per GiB here, ten times
the cost of reusing memory freed a moment earlier (1 GiB of pwrite: 2.5 s vs
0.19 s; the balloon driver hands freed pages back to the host within seconds).
Every system here writes 8-10 GiB of new files, so this cost dominates all
three (perf: 63% of all CPU in the kernel's copy into new page-cache folios
during the swarmrl run) and varies between runs by how much memory happens to
be warm. Writing and deleting a scratch file first did not help, because the
pages were cold again by the time the run started. Compare the ratios within
one run, over several runs. On this 2-core machine all the processes
share two cores, so ratios matter more than absolute figures.

Usage: .venv/bin/python bench/shardcast.py [--mib 1024] [--only swarmrl,published,nginx]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchproc import free_port  # noqa: E402

from swarmrl.protocol.identity import load_or_create_key, public_key_hex  # noqa: E402
from swarmrl.shardcast.local import LocalWeights, version_dir_name  # noqa: E402


def make_source(path: Path, mib: int) -> str:
    """Write `mib` MiB of random bytes; return their sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(mib):
            block = os.urandom(1 << 20)
            h.update(block)
            f.write(block)
    return h.hexdigest()


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_http(url: str, timeout: float = 30.0) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def run_swarmrl(
    src: Path,
    work: Path,
    clients: int = 8,
    relays: int = 2,
    shard_mb: float = 50,
    overrides: list[str] = (),
) -> dict:
    key = load_or_create_key(work / "keys" / "trainer.key")
    pub = public_key_hex(key)
    # Prepare and sign the version outside the served directory.
    staging = LocalWeights(work / "staging", keep=10, key=key, shard_bytes=int(shard_mb * 1e6))
    d = staging.staging_dir(0)
    os.link(src, d / "model.safetensors")
    staging.publish(0)
    served = work / "origin"
    served.mkdir()
    cli = [sys.executable, "-m", "swarmrl"]
    common = [f"shardcast.public_key={pub}", "shardcast.poll_wait_s=30"]
    common += list(overrides)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs: list[subprocess.Popen] = []
    logs = work / "logs"
    logs.mkdir()

    def start(name: str, argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(
            argv,
            stdout=open(logs / f"{name}.out", "wb"),
            stderr=open(logs / f"{name}.log", "wb"),
            env=env,
            start_new_session=True,
        )
        procs.append(p)
        return p

    try:
        oport = free_port()
        start("origin", cli + ["origin", "--dir", str(served), "--port", str(oport), *common])
        origin_url = f"http://127.0.0.1:{oport}"
        _wait_http(origin_url + "/health")
        relay_urls, relay_procs = [], []
        for i in range(relays):
            port = free_port()
            relay_procs.append(
                start(
                    f"relay-{i}",
                    cli
                    + ["relay", "--upstream", origin_url, "--port", str(port)]
                    + ["--dir", str(work / f"relay-{i}"), *common],
                )
            )
            relay_urls.append(f"http://127.0.0.1:{port}")
        for u in relay_urls:
            _wait_http(u + "/health")
        client_servers = relay_urls or [origin_url]
        client_procs = [
            start(
                f"client-{i}",
                cli
                + [
                    "fetch",
                    "--servers",
                    ",".join(client_servers),
                    "--dir",
                    str(work / f"client-{i}"),
                ]
                + ["--timeout", "900", *common],
            )
            for i in range(clients)
        ]
        time.sleep(3.0)  # every client imported and long-polling
        t0 = time.time()
        os.rename(d, served / version_dir_name(0))
        relay_peak = 0.0
        while any(p.poll() is None for p in client_procs):
            relay_peak = max([relay_peak] + [peak_rss_mb(p.pid) for p in relay_procs])
            time.sleep(0.05)
        seconds = time.time() - t0
        relay_peak = max([relay_peak] + [peak_rss_mb(p.pid) for p in relay_procs])
        relay_cpu = [cpu_s(p.pid) for p in relay_procs]
        origin_cpu = cpu_s(procs[0].pid)
        results = []
        for i, p in enumerate(client_procs):
            if p.returncode != 0:
                raise RuntimeError(f"client {i} failed: {(logs / f'client-{i}.log').read_text()}")
            results.append(json.loads((logs / f"client-{i}.out").read_text().splitlines()[-1]))
        size = src.stat().st_size
        return {
            "seconds": round(seconds, 3),
            "throughput_MBps": round(clients * size / seconds / 1e6, 1),
            "peak_rss_relay_MB": round(relay_peak, 1),
            "peak_rss_client_MB": round(max(r["peak_rss_MB"] for r in results), 1),
            "client_seconds": [round(r["seconds"], 2) for r in results],
            "cpu_s": {
                "origin": round(origin_cpu, 2),
                "relays": [round(c, 2) for c in relay_cpu],
                "clients": [round(r["cpu_s"], 2) for r in results],
                "clients_user": [round(r.get("cpu_user_s", 0), 2) for r in results],
                "clients_ctx": [r.get("ctx_switches", 0) for r in results],
            },
            "shard_MB": shard_mb,
        }
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _verify_clients(work: Path, clients: int, digest: str) -> None:
    for i in range(clients):
        got = hashlib.sha256()
        with open(work / f"client-{i}" / version_dir_name(0) / "model.safetensors", "rb") as f:
            while chunk := f.read(1 << 24):
                got.update(chunk)
        if got.hexdigest() != digest:
            raise RuntimeError(f"client {i} holds a wrong file")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument(
        "--relays", type=int, default=2, help="swarmrl only: 0 = clients use the origin"
    )
    ap.add_argument("--only", default="swarmrl,published,nginx")
    ap.add_argument(
        "--set", action="append", default=[], help="swarmrl override, e.g. shardcast.parallel=4"
    )
    ap.add_argument("--workdir", default=None, help="default: a temporary directory")
    args = ap.parse_args()
    which = set(args.only.split(","))
    base = Path(args.workdir or tempfile.mkdtemp(prefix="shardcast-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    out: dict = {"mib": args.mib, "clients": args.clients, "relays": args.relays}
    try:
        src = base / "checkpoint.bin"
        digest = make_source(src, args.mib)
        if "swarmrl" in which:
            work = base / "swarmrl"
            work.mkdir()
            out["swarmrl"] = run_swarmrl(src, work, args.clients, args.relays, overrides=args.set)
            _verify_clients(work, args.clients, digest)
            if not args.workdir:
                shutil.rmtree(work)
        if "published" in which or "nginx" in which:
            import nginx_curl
            import shardcast_peers

            if "published" in which:
                work = base / "published"
                work.mkdir()
                out["published_shardcast"] = shardcast_peers.run_published_shardcast(
                    src, work, clients=args.clients, relays=2
                )
                shutil.rmtree(work, ignore_errors=True)
            if "nginx" in which:
                work = base / "nginx"
                work.mkdir()
                out["nginx_curl"] = nginx_curl.run_nginx_curl(src, work, clients=args.clients)
                shutil.rmtree(work, ignore_errors=True)
        ours = out.get("swarmrl", {}).get("seconds")
        if ours and "published_shardcast" in out:
            out["speedup_vs_published"] = round(out["published_shardcast"]["seconds"] / ours, 2)
        if ours and "nginx_curl" in out:
            out["fraction_of_nginx_throughput"] = round(out["nginx_curl"]["seconds"] / ours, 3)
        print(json.dumps(out))
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        (results / "shardcast.json").write_text(json.dumps(out, indent=1) + "\n")
    finally:
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
