"""A swarm of dozens of nodes on shaped links, with churn and cheaters, measured end
to end (issue 36; a first version: see "Not yet" below).

The run is `swarmrl rl` on the tiny model (configs/tiny.toml), placed on an emulated
network (sim/netns.py, sim/emulated.py): every process in a namespace of its own, on
a link shaped with `tbf`, workers held to a share of a core. The relays form a tree
of `--levels` levels. Everything that happens to the swarm is triggered by the
trainer's step, never by the clock, so that the same events fall at the same point
of the run on any machine:

- `--late` workers wait for a flag file that is created at step 2 (they join late);
- at step 3, `--churn` of the workers are killed outright (every process in their
  namespace, SIGKILL): the launcher restarts them, as a node that comes back;
- when the trainer publishes the version after step 4, the first relay is killed
  at once (during that version's broadcast); it is restarted too;
- at step 5 the first validator is killed; at step 6 the orchestrator (SIGKILL),
  which the launcher restarts on its port, from its database;
- `--cheaters` dishonest workers of different kinds run from the start.

The figures come from what the run leaves: metrics.jsonl (steps, the trainer's time
in updates), the orchestrator's database (each file's fate, staleness), the
SHARDCAST clients' logs (weights lag per tree level, bytes), the orchestrator's
Prometheus histogram (request latency, scraped every step and across its restart),
the validators' backlog (pending files, scraped every step) and eval.json (held-out
accuracy, greedy, before and after).

Definitions:
- `files.lost`: honest files on the orchestrator's ledger in no state that says what
  became of them (a file an honest worker submitted must end trained, stale,
  rejected with a reason, or still queued when the run ended: `files.unused_at_end`);
- `files.dropped_no_signal`: groups (not files) the trainer read and dropped for
  lack of signal (metrics' `dropped_groups`);
- `trainer_busy_fraction`: the trainer's update time over the wall time from its
  first step to its last;
- `weights_lag_s`: per level (1 and on: relays; "nodes": workers and validators),
  p50 and p99 of the seconds from a version's publication to a node holding it.

Not yet (issue 36 goes on): the timeline plot, `swarmrl plan`, and fixes for what
this run shows. Needs root and network namespaces: where they cannot be made it
says why and exits 2 (no fallback to loopback).

    .venv/bin/python bench/swarm_scale.py [--workers 32] [--steps 12] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarmrl.sim import netns  # noqa: E402

CHEATS = ["inflated-reward", "wrong-seed", "forged-logprobs", "other-model", "truncate"]
LINKS = (10, 50, 100)  # Mbit/s, the workers' in turn
LAG = re.compile(r"version (\d+): ([\d.]+) MB in [\d.]+s \(([\d.]+)s after publish\)")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--late", type=int, default=4, help="of the workers, joining at step 2")
    p.add_argument("--churn", type=float, default=0.2, help="fraction of workers killed")
    p.add_argument("--relays", type=int, default=3)
    p.add_argument("--levels", type=int, default=2)
    p.add_argument("--validators", type=int, default=2)
    p.add_argument("--cheaters", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--worker-cpu", type=float, default=0.25, help="cores per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="/tmp/swarm-scale", help="runs directory")
    return p.parse_args()


class Chaos(threading.Thread):
    """The run's events, each at its step (see the module's docstring)."""

    def __init__(self, net: netns.Network, run: Path, a: argparse.Namespace, url: list[str]):
        super().__init__(daemon=True)
        self.net, self.run_dir, self.a, self.url = net, run, a, url
        self.flag = run.parent / "late-workers.go"
        self.events: list[dict] = []
        self.scrapes: list[dict] = []  # /metrics, once a step
        self.stop = threading.Event()

    def step(self) -> int:
        p = self.run_dir / "metrics.jsonl"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def published(self) -> int:
        p = self.run_dir / "published.jsonl"
        return len(p.read_text().splitlines()) if p.exists() else 0

    def kill(self, name: str, why: str) -> None:
        node = self.net.nodes[name]
        pids = netns._ip("netns", "pids", node.namespace, check=False).stdout.split()
        netns._kill_all(int(p) for p in pids)
        self.events.append({"step": self.step(), "kill": name, "processes": len(pids), "why": why})

    def run(self) -> None:
        a = self.a
        done: set[str] = set()
        workers = [f"worker-{i}" for i in range(a.workers - a.late)]
        churn = workers[: max(1, round(a.churn * a.workers))]
        seen = -1
        while not self.stop.wait(0.2):
            step = self.step()
            if step != seen:
                seen = step
                self.scrape()
            if step >= 2 and "late" not in done:
                self.flag.touch()
                self.events.append({"step": step, "join": a.late})
                done.add("late")
            if step >= 3 and "churn" not in done:
                for name in churn:
                    self.kill(name, "churn")
                done.add("churn")
            if step >= 4 and "relay" not in done:
                if "relay_at" not in done:
                    base = self.published()
                    done.add("relay_at")
                if self.published() > base:  # a version was just published
                    self.kill("relay-0", "during a broadcast")
                    done.add("relay")
            if step >= 5 and "validator" not in done and a.validators:
                self.kill("validator-0", "validator")
                done.add("validator")
            if step >= 6 and "orchestrator" not in done:
                self.scrape()
                self.kill("orchestrator", "orchestrator SIGKILL")
                done.add("orchestrator")

    def scrape(self) -> None:
        import httpx

        try:
            text = httpx.get(self.url[0] + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return
        self.scrapes.append({"step": self.step(), "text": text})


def _histogram(text: str) -> tuple[dict[float, float], float]:
    """The API latency histogram's cumulative buckets over all routes, and its count."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        m = re.match(r'swarmrl_request_seconds_bucket\{.*le="([^"]+)".*\} ([\d.e+]+)', line)
        if m:
            le = float("inf") if m[1] == "+Inf" else float(m[1])
            buckets[le] = buckets.get(le, 0.0) + float(m[2])
    return buckets, buckets.get(float("inf"), 0.0)


def _p99_ms(scrapes: list[dict]) -> float | None:
    """p99 over every lifetime of the orchestrator: the last scrape before each restart
    (a count that drops is a restart), summed; the bucket bound the 99th percentile
    falls in (an upper bound; the buckets end at 1 s)."""
    lives, last = [], None
    for s in scrapes:
        h, n = _histogram(s["text"])
        if last is not None and n < last[1]:
            lives.append(last)
        last = (h, n)
    if last:
        lives.append(last)
    total: dict[float, float] = {}
    for h, _ in lives:
        for le, c in h.items():
            total[le] = total.get(le, 0.0) + c
    count = total.get(float("inf"), 0.0)
    if not count:
        return None
    for le in sorted(total):
        if total[le] >= 0.99 * count:
            return le * 1000.0
    return None


def _backlog(scrapes: list[dict]) -> int:
    most = 0
    for s in scrapes:
        m = re.search(r'swarmrl_files\{state="pending"\} ([\d.e+]+)', s["text"])
        most = max(most, int(float(m[1]))) if m else most
    return most


def _quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None, "n": 0}
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 2),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2), "n": len(xs)}  # fmt: skip


def _lags(logs: Path, layout, relays: int) -> tuple[dict, float, float]:
    """Weights lag per level, and MB served by the origin and delivered to all."""
    by_level: dict[str, list[float]] = {}
    origin_mb = delivered_mb = 0.0
    for log in logs.glob("*.log"):
        name = log.stem
        if name.startswith("relay-"):
            level = str(layout.level(int(name.split("-")[1])) + 1)
        elif name.startswith(("worker-", "validator-", "cheater-")):
            level = "nodes"
        else:
            continue
        for line in log.read_text(errors="replace").splitlines():
            m = LAG.search(line)
            if m:
                by_level.setdefault(level, []).append(float(m[3]))
                delivered_mb += float(m[2])
                if level == "1":
                    origin_mb += float(m[2])
    return {k: _quantiles(v) for k, v in sorted(by_level.items())}, origin_mb, delivered_mb


def _files(run: Path, names: dict[str, str], metrics: list[dict]) -> tuple[dict, dict, dict]:
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    rows = db.execute("SELECT node, state, void, step, policy FROM files").fetchall()
    states: dict[str, int] = {}
    honest_states: dict[str, int] = {}
    staleness: dict[str, int] = {}
    for node, state, void, step, policy in rows:
        key = "voided" if void else state
        states[key] = states.get(key, 0) + 1
        if names.get(node, "").startswith("worker-"):
            honest_states[key] = honest_states.get(key, 0) + 1
        if state == "trained":
            s = str(step - policy)
            staleness[s] = staleness.get(s, 0) + 1
    ended = ("trained", "stale", "rejected", "voided")
    queued = ("pending", "accepted", "consumed")  # still in the queue when the run ended
    files = {
        "generated": len(rows),
        "accepted": sum(states.get(s, 0) for s in ("accepted", "consumed", "trained")),
        "trained": states.get("trained", 0),
        "stale": states.get("stale", 0),
        "dropped_no_signal": sum(m.get("dropped_groups", 0) for m in metrics),
        "rejected": states.get("rejected", 0),
        "voided": states.get("voided", 0),
        "unused_at_end": sum(honest_states.get(s, 0) for s in queued),
        "lost": sum(n for s, n in honest_states.items() if s not in ended + queued),
    }
    return files, honest_states, dict(sorted(staleness.items(), key=lambda kv: int(kv[0])))


def main() -> int:
    a = _args()
    ok, why = netns.available()
    if not ok:
        print(json.dumps({"skipped": why}))
        return 2
    from swarmrl.config import load_config
    from swarmrl.launch.swarm import launch
    from swarmrl.sim.emulated import Emulated, Layout

    tiny = ROOT / "models" / "tiny-reverse_text"
    if not (tiny / "warm_start.json").exists():
        print(json.dumps({"skipped": f"no tiny model at {tiny}: make run-tiny builds it"}))
        return 2
    runs = Path(a.runs)
    config = str(ROOT / "configs" / "tiny.toml")
    honest = a.workers
    overrides = [
        f"runs_dir={json.dumps(str(runs))}", f"model.path={json.dumps(str(tiny))}",
        "name=swarm", f"seed={a.seed}", f"trainer.steps={a.steps}",
        f"launcher.workers={honest}", f"shardcast.relays={a.relays}",
        f"validator.count={a.validators}", "validator.enabled=true",
        "orchestrator.range_share=1",  # all nodes share one emulated /15; ranges: test_orchestrator_ranges.py
        "launcher.max_worker_restarts=10",
    ]  # fmt: skip
    cfg = load_config(config, overrides)
    links = {f"worker-{i}": LINKS[i % len(LINKS)] for i in range(honest)}
    links |= {f"cheater-{i}": LINKS[i % len(LINKS)] for i in range(a.cheaters)}
    links |= {"relay": 100, "trainer": 100, "orchestrator": 100, "validator": 100}
    layout = Layout(links=links, cpus={"worker": a.worker_cpu, "cheater": a.worker_cpu},
                    fanout=max(1, a.relays // (2 ** (a.levels - 1))), levels=a.levels)  # fmt: skip
    url: list[str] = []
    t0 = time.monotonic()
    with netns.Network("scale") as net:
        net.attach_host()
        place = Emulated(net, layout)
        shutil.rmtree(cfg.run_dir, ignore_errors=True)  # the chaos reads its steps from it
        chaos = Chaos(net, cfg.run_dir, a, url)
        chaos.flag.unlink(missing_ok=True)
        late = {f"worker-{i}" for i in range(honest - a.late, honest)}
        wrap = place.wrap

        def wrap_late(proc):  # late workers wait for the flag (step 2) before they start
            if proc.name in late:
                proc.argv = ["sh", "-c", f'while [ ! -e "{chaos.flag}" ]; do sleep 0.2; done;'
                             ' exec "$@"', "late", *proc.argv]  # fmt: skip
            wrap(proc)

        place.wrap = wrap_late
        url.append(f"http://{place.host('orchestrator', '')}:8000")
        chaos.start()
        try:
            code = launch(cfg, config, overrides, resume=False, fresh=True, cheaters=a.cheaters,
                          cheats=CHEATS[: a.cheaters], place=place)  # fmt: skip
        finally:
            chaos.stop.set()
            chaos.join(10)
    wall = time.monotonic() - t0
    run = cfg.run_dir
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    names = {p.read_text().strip(): p.parent.name for p in (run / "nodes").glob("*/node.pub")}
    files, honest_states, staleness = _files(run, names, metrics)
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    ledger = dict(db.execute("SELECT key, state FROM nodes").fetchall())
    cheater_keys = [k for k, n in names.items() if n.startswith("cheater-")]
    lags, origin_mb, delivered_mb = _lags(run / "logs", layout, a.relays)
    evals = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {}
    busy = sum(m.get("train_s", 0.0) for m in metrics[1:])
    span = metrics[-1]["elapsed_s"] - metrics[0]["elapsed_s"] if len(metrics) > 1 else 0.0
    out = {
        "exit_code": code,
        "seed": a.seed,
        "wall_s": round(wall, 1),
        "workers_max": honest + a.cheaters,
        "relays": a.relays,
        "tree_depth": a.levels,
        "validators": a.validators,
        "churn_events": len([e for e in chaos.events if "kill" in e]),
        "events": chaos.events,
        "link_mbit": sorted(set(links.values())),
        "steps": len(metrics),
        "trainer_busy_fraction": round(busy / span, 3) if span else None,
        "files": files,
        "honest_files_rejected": honest_states.get("rejected", 0),
        "cheaters": a.cheaters,
        "cheaters_ejected": sum(ledger.get(k) in ("ejected", "banned") for k in cheater_keys),
        "weights_lag_s": lags,
        "origin_bytes_out": int(origin_mb * 1e6),
        "bytes_delivered": int(delivered_mb * 1e6),
        "orchestrator_p99_ms": _p99_ms(chaos.scrapes),
        "validator_backlog_max": _backlog(chaos.scrapes),
        "staleness_histogram": staleness,
        "heldout_accuracy": {
            "before": evals.get("start_model", {}).get("accuracy"),
            "after": evals.get("final_model", {}).get("accuracy"),
        },
    }
    print(json.dumps(out))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
