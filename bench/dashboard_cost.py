"""What the live dashboard costs a running swarm: the orchestrator's CPU and its answer
latency with no browser on the dashboard and with one (headless Chromium, polling as a
person's tab does), side by side in one run.

The swarm is `swarmrl rl` on the tiny model (configs/tiny.toml: trainer, relay,
validator, two workers), run long enough for every window. Windows alternate
(without, with, without, with, ...) so that drift in the swarm's own load falls on
both sides. In each window:
- orchestrator CPU: its process's user + system time (/proc/<pid>/stat) per second
  of wall time, in cores;
- latency: a probe asks GET /v1/run/servers (one database read, as a node's server
  refresh) every 100 ms and times the answer client-side; p50 and p99;
- the dashboard's own requests per second (the orchestrator's /metrics counters).

The browser runs on this machine too, so "with" also carries Chromium's own CPU next to
the orchestrator (on a 2-core VM, a real cost that a remote browser would not add).
Prints one JSON object; ratios are what to compare. Skipped (JSON says why) where
Chromium or Playwright is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.benchproc import find_pid, free_port, interrupt_group  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def dashboard_requests(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("swarmrl_requests_total{") and "dashboard" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def window(url: str, pid: int, seconds: float) -> dict:
    lat: list[float] = []
    stop = threading.Event()

    def probe():
        with httpx.Client(base_url=url, timeout=10) as c:
            while not stop.is_set():
                t = time.perf_counter()
                c.get("/v1/run/servers").raise_for_status()
                lat.append(time.perf_counter() - t)
                stop.wait(0.1)

    th = threading.Thread(target=probe)
    c0, d0, t0 = cpu_s(pid), dashboard_requests(url), time.time()
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    c1, d1, t1 = cpu_s(pid), dashboard_requests(url), time.time()
    lat.sort()
    return {
        "cpu_cores": (c1 - c0) / (t1 - t0),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "probes": len(lat),
        "dashboard_requests_per_s": (d1 - d0) / (t1 - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of one window")
    ap.add_argument("--pairs", type=int, default=2, help="windows without and with, each")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if chromium is None or sync_playwright is None:
        print(json.dumps({"bench": "dashboard_cost", "skipped": "needs chromium and playwright"}))
        return
    tmp = Path(tempfile.mkdtemp(prefix="dashcost-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "swarmrl", "rl", "--config", str(ROOT / "configs/tiny.toml"),
           f"runs_dir={json.dumps(str(tmp / 'runs'))}", "trainer.steps=100000",
           "launcher.eval_problems=0", f"orchestrator.url={json.dumps(url)}",
           f"orchestrator.port={port}"]  # fmt: skip
    log = open(tmp / "launcher.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True)  # fmt: skip
    run = tmp / "runs" / "tiny"
    try:
        deadline = time.time() + 300
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the swarm did not train a step; see {tmp / 'launcher.log'}")
            time.sleep(1)
        pid = find_pid("orchestrator", str(run.parent))
        if pid is None:
            raise RuntimeError("no orchestrator process found")
        out = {"without": [], "with": []}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for _ in range(args.pairs):
                out["without"].append(window(url, pid, args.seconds))
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                page.goto(url + "/dashboard")
                page.wait_for_selector("#nodes tbody tr")
                out["with"].append(window(url, pid, args.seconds))
                page.close()
            browser.close()
        steps = len((run / "metrics.jsonl").read_text().splitlines())
    finally:
        interrupt_group(proc)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)

    def mean(side: str, k: str) -> float:
        return statistics.mean(w[k] for w in out[side])

    summary = {k: {"without": mean("without", k), "with": mean("with", k)}
               for k in ("cpu_cores", "p50_ms", "p99_ms", "dashboard_requests_per_s")}  # fmt: skip
    print(json.dumps({
        "bench": "dashboard_cost",
        "machine": f"{os.cpu_count()} cores",
        "swarm": "swarmrl rl, configs/tiny.toml (trainer, relay, validator, 2 workers)",
        "window_s": args.seconds, "pairs": args.pairs, "steps_trained": steps,
        "summary": summary,
        "ratios": {
            "orchestrator_cpu_with_over_without": summary["cpu_cores"]["with"]
            / max(summary["cpu_cores"]["without"], 1e-9),
            "p99_with_over_without": summary["p99_ms"]["with"] / summary["p99_ms"]["without"],
        },
        "windows": out,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
