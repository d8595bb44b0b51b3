"""A swarm of dozens of nodes on shaped links, with churn and cheaters, measured end
to end (issue 36).

The run is `swarmrl rl` on the tiny model (configs/tiny.toml), placed on an emulated
network (sim/netns.py, sim/emulated.py): every process in a namespace of its own, on
a link shaped with `tbf`, workers held to a share of a core, every node with a CPU
weight (`WEIGHTS`). The relays form a tree of `--levels` levels. Everything that
happens to the swarm is triggered by the trainer's step, never by the clock, so that
the same events fall at the same point of the run on any machine:

- `--late` workers wait for a flag file that is created at step 2 (they join late);
- at step 3, `--churn` of the workers are killed outright (every process in their
  namespace, SIGKILL): the launcher restarts them, as a node that comes back;
- when the trainer publishes the version after step 4, the first relay is killed
  at once (during that version's broadcast); it is restarted too;
- at step 5 the first validator is killed; at step 6 the orchestrator (SIGKILL),
  which the launcher restarts on its port, from its database;
- `--cheaters` dishonest workers of different kinds run from the start, admitted
  as strangers (probation, proof of work).

The figures come from what the run leaves: metrics.jsonl (steps, the trainer's time
in updates), the orchestrator's database (each file's fate, staleness), the workers'
logs (the files they submitted), the SHARDCAST clients' logs (weights lag per tree
level, bytes), the orchestrator's Prometheus histogram (request latency, scraped
every step and across its restart), the validators' backlog (pending files, scraped
every step), /proc (CPU seconds by role, sampled every 2 s) and eval.json (held-out
accuracy, greedy, before and after). The run directory also gets timeline.json and
timeline.png (nodes up, steps, weights lag per level, files by fate).

Definitions:
- `files.lost`: honest files a worker says it submitted (its log), or that the
  ledger holds past their upload, whose fate the ledger does not give (trained,
  stale, rejected, voided, or still queued when the run ended: `unused_at_end`);
- `files.dropped_no_signal`: groups (not files) the trainer read and dropped for
  lack of signal (metrics' `dropped_groups`);
- `trainer_busy_fraction`: the trainer's update time over the wall time from its
  first step to its last;
- `weights_lag_s`: per level (1 and on: relays; "nodes": workers and validators),
  p50 and p99 of the seconds from a version's publication to a node holding it;
- `orchestrator_p99_ms`: read off the histogram's buckets, linear within one.

With `--costs F` (from `swarmrl plan --calibrate --save-costs F`) the JSON also holds
the planner's prediction of this run (`plan`). Needs root and network namespaces:
where they cannot be made it says why and exits 2 (no fallback to loopback).

    .venv/bin/python bench/swarm_scale.py [--workers 32] [--steps 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sqlite3
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarmrl.sim import netns  # noqa: E402

CHEATS = ["inflated-reward", "wrong-seed", "forged-logprobs", "other-model", "truncate"]
LINKS = (10, 50, 100)  # Mbit/s, the workers' in turn
# cpu.shares by role: every node competes inside the run's cgroup. The orchestrator,
# the relays, the validators and the trainer have machines (GPUs) of their own in a
# real swarm and do not slow down as workers join: here they come first when they
# want the CPU; the workers share what is left, each held to --worker-cpu
WEIGHTS = {"orchestrator": 16384, "relay": 4096, "trainer": 8192, "validator": 8192,
           "worker": 1024, "cheater": 1024}  # fmt: skip
SUBMITTED = re.compile(r"step \d+ policy \d+: .* -> (rollouts/\S+)")
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
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--groups-per-file", type=int, default=2)
    p.add_argument(
        "--batches-out",
        type=int,
        default=2,
        help="work out at once, in trainer batches (worker.max_pending_groups)",
    )
    p.add_argument("--worker-cpu", type=float, default=0.25, help="cores per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="/tmp/swarm-scale", help="runs directory")
    p.add_argument(
        "--costs",
        help="planner costs (swarmrl plan --calibrate --save-costs F): "
        "the JSON then holds the planner's prediction of this run beside it",
    )
    p.add_argument("--plot", help="also write the timeline plot here (it is always in the run)")
    return p.parse_args()


class Chaos(threading.Thread):
    """The run's events, each at its step (see the module's docstring)."""

    def __init__(self, net: netns.Network, run: Path, a: argparse.Namespace, url: list[str]):
        super().__init__(daemon=True)
        self.net, self.run_dir, self.a, self.url = net, run, a, url
        self.flag = run.parent / "late-workers.go"
        self.late = {f"worker-{i}" for i in range(a.workers - a.late, a.workers)}
        self.events: list[dict] = []
        self.scrapes: list[dict] = []  # /metrics, once a step
        self.up: list[tuple[float, int, int]] = []  # (time, worker nodes up, others up)
        self.cpu: dict[tuple[str, int], float] = {}  # (node, pid) -> CPU seconds, last seen
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
        self.events.append({"step": self.step(), "kill": name, "processes": len(pids), "why": why,
                            "time": time.time()})  # fmt: skip

    def run(self) -> None:
        a = self.a
        done: set[str] = set()
        workers = [f"worker-{i}" for i in range(a.workers - a.late)]
        churn = workers[: max(1, math.ceil(a.churn * a.workers))]  # at least that share
        seen, counted = -1, 0.0
        while not self.stop.wait(0.2):
            if time.time() - counted >= 2.0:
                counted = time.time()
                self.count_up(counted)
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

    def count_up(self, now: float) -> None:
        """Nodes with a process running in their namespace (the timeline's nodes up)."""
        workers = others = 0
        joined = self.flag.exists()
        for name, node in list(self.net.nodes.items()):
            pids = netns._ip("netns", "pids", node.namespace, check=False).stdout.split()
            for pid in pids:
                self.cpu[(name, int(pid))] = _cpu_s(int(pid)) or self.cpu.get((name, int(pid)), 0)
            if name in self.late and not joined:
                continue  # a late worker's shell, waiting for its flag
            if pids and name.startswith(("worker-", "cheater-")):
                workers += 1
            elif pids:
                others += 1
        self.up.append((now, workers, others))

    def scrape(self) -> None:
        import httpx

        try:
            text = httpx.get(self.url[0] + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return
        self.scrapes.append({"step": self.step(), "text": text})


def _cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_role(cpu: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU seconds by role (sampled every 2 s: a process's last 2 s before it died are
    missing)."""
    roles: dict[str, float] = {}
    for (name, _), used in cpu.items():
        role = name.split("-")[0]
        roles[role] = round(roles.get(role, 0.0) + used, 1)
    return dict(sorted(roles.items()))


def _histogram(text: str, route: str | None = None) -> tuple[dict[float, float], float]:
    """The API latency histogram's cumulative buckets over all routes (or `route`'s),
    and its count."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        m = re.match(r"swarmrl_request_seconds_bucket\{([^}]*)\} ([\d.e+]+)", line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1])) if m else {}
        if m and (route is None or labels.get("route") == route):
            le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + float(m[2])
    return buckets, buckets.get(float("inf"), 0.0)


def _routes(scrapes: list[dict]) -> dict[str, float | None]:
    """p99 per route over the orchestrator's last life (where a slow p99 comes from)."""
    if not scrapes:
        return {}
    text = scrapes[-1]["text"]
    names = sorted(set(re.findall(r'swarmrl_request_seconds_bucket\{[^}]*route="([^"]+)"', text)))
    return {r: _quantile(_histogram(text, r)[0], 0.99) for r in names}


def _p99_ms(scrapes: list[dict]) -> float | None:
    """p99 over every lifetime of the orchestrator: the last scrape before each restart
    (a count that drops is a restart), summed; the 99th percentile read off the
    buckets (orchestrator/asgi.py: 10 ms apart from 10 to 50 ms)."""
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
    return _quantile(total, 0.99)


def _quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The q-quantile in ms from cumulative buckets, linear within the bucket it falls
    in (as Prometheus' histogram_quantile reads them); None past the last finite bound."""
    count = cumulative.get(float("inf"), 0.0)
    if not count:
        return None
    lower, below = 0.0, 0.0
    for le in sorted(cumulative):
        if cumulative[le] >= q * count:
            if le == float("inf"):
                return None
            inside = cumulative[le] - below
            share = (q * count - below) / inside if inside else 1.0
            return round((lower + (le - lower) * share) * 1000.0, 1)
        lower, below = le, cumulative[le]
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


def _log_time(line: str) -> float | None:
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def _timeline(run: Path, chaos: Chaos, layout) -> dict:
    """What the plot shows, in seconds since the first version's publication: nodes
    up, the trainer's steps (each version's publication), each node's weights lag
    by level, and each honest or dishonest file's submission with its fate."""
    published = [json.loads(x) for x in (run / "published.jsonl").read_text().splitlines() if x]
    t0 = min(p["time"] for p in published)
    lags: dict[str, list[tuple[float, float]]] = {}
    for log in (run / "logs").glob("*.log"):
        name = log.stem
        if name.startswith("relay-"):
            level = f"relays, level {layout.level(int(name.split('-')[1])) + 1}"
        elif name.startswith(("worker-", "validator-", "cheater-")):
            level = "workers and validators"
        else:
            continue
        for line in log.read_text(errors="replace").splitlines():
            m, t = LAG.search(line), _log_time(line)
            if m and t is not None:
                lags.setdefault(level, []).append((round(t - t0, 1), float(m[3])))
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    files = [
        (round(t - t0, 1), "voided" if void else state)
        for t, state, void in db.execute("SELECT submitted, state, void FROM files")
        if t is not None
    ]
    return {
        "up": [(round(t - t0, 1), w, o) for t, w, o in chaos.up],
        "steps": [(round(p["time"] - t0, 1), p["version"]) for p in published],
        "lag": {k: sorted(v) for k, v in sorted(lags.items())},
        "files": sorted(files),
        "events": [{**e, "at": round(e["time"] - t0, 1)} for e in chaos.events if "time" in e],
    }


def plot_timeline(tl: dict, path: Path) -> None:
    """Four panels over one time axis: nodes up, steps, weights lag, files by fate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    t = [u[0] for u in tl["up"]]
    ax[0].step(t, [u[1] for u in tl["up"]], where="post", label="workers (incl. cheaters)")
    ax[0].step(t, [u[2] for u in tl["up"]], where="post", label="other nodes")
    ax[0].set_ylabel("nodes up")
    ax[1].step([s[0] for s in tl["steps"]], [s[1] for s in tl["steps"]], where="post")
    ax[1].set_ylabel("policy version")
    for level, points in tl["lag"].items():
        ax[2].scatter([p[0] for p in points], [p[1] for p in points], s=6, label=level)
    ax[2].set_ylabel("weights lag (s)")
    fates = sorted({f for _, f in tl["files"]})
    for fate in fates:
        times = [t for t, f in tl["files"] if f == fate]
        ax[3].step(times, range(1, len(times) + 1), where="post", label=fate)
    ax[3].set_ylabel("files submitted")
    ax[3].set_xlabel("seconds since version 1 was published")
    for e in tl["events"]:
        if "kill" in e and "at" in e:
            for a in ax:
                a.axvline(e["at"], color="grey", lw=0.6, ls=":")
    for a in ax:
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="upper left")
    ax[0].set_title("swarm_scale: kills dotted")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def scenario(a: argparse.Namespace, cfg, layout, costs):
    """This run as the planner's model sees it (plan/model.py): the same workers,
    links, shares and weights, tree, work cap and events; cheaters are left out."""
    from swarmrl.plan.model import Swarm, Workers

    kinds: dict[tuple[float, int], int] = {}
    for i in range(a.workers):
        kind = (float(LINKS[i % len(LINKS)]), 2 if i >= a.workers - a.late else 0)
        kinds[kind] = kinds.get(kind, 0) + 1
    levels = [sum(layout.level(i) == lv for i in range(a.relays)) for lv in range(a.levels)]
    return Swarm(
        workers=[Workers(n, mbit, cores=a.worker_cpu, join_step=j) for (mbit, j), n in kinds.items()],
        steps=a.steps, batch_groups=cfg.trainer.batch_groups,
        groups_per_file=a.groups_per_file, async_level=cfg.async_level,
        max_pending_groups=a.batches_out * cfg.trainer.batch_groups, relays=levels,
        work_slack_steps=cfg.orchestrator.work_slack_steps,
        relay_mbit=float(layout.links["relay"]), origin_mbit=float(layout.links["trainer"]),
        validators=a.validators, validator_mbit=float(layout.links["validator"]),
        sample_rate=cfg.validator.sample_rate, heartbeat_s=cfg.orchestrator.heartbeat_s,
        host_cores=float(os.cpu_count() or 1), weights={k: float(v) for k, v in WEIGHTS.items()},
        churn=[(3, math.ceil(a.churn * a.workers) / a.workers, 2.0)],
        orchestrator_down=(6, 5.0), seed=a.seed,
    )  # fmt: skip


def predicted(a: argparse.Namespace, cfg, layout, out: dict) -> dict:
    """The planner's figures for this run, beside the run's own, with their ratio."""
    from swarmrl.plan.model import Costs, simulate

    costs = Costs(**json.loads(Path(a.costs).read_text()))
    plan = simulate(scenario(a, cfg, layout, costs), costs)
    files = out["files"]
    mine = {
        "trainer_busy_fraction": out["trainer_busy_fraction"],
        "weights_lag_p50_s": out["weights_lag_s"].get("nodes", {}).get("p50"),
        "stale_fraction": round(files["stale"] / files["generated"], 3)
        if files["generated"] else None,
    }  # fmt: skip
    theirs = {
        "trainer_busy_fraction": plan.trainer_busy_fraction,
        "weights_lag_p50_s": plan.weights_lag_s.get("nodes", {}).get("p50"),
        "stale_fraction": plan.stale_fraction,
    }
    ratio = {k: round(theirs[k] / mine[k], 2) if mine[k] else None for k in mine}
    return {"emulated": mine, "planned": theirs, "planned_over_emulated": ratio,
            "costs": costs.__dict__}  # fmt: skip


def _submitted(logs: Path) -> set[str]:
    """The files honest workers say they uploaded and submitted (their logs)."""
    keys: set[str] = set()
    for log in logs.glob("worker-*.log"):
        keys.update(SUBMITTED.findall(log.read_text(errors="replace")))
    return keys


def _fate(state: str, void: int) -> str:
    """A file's fate as the JSON counts it: `discarded` is a stale file whose object is
    deleted (orchestrator/files.py), a void one belongs to an ejected node."""
    return "voided" if void else "stale" if state == "discarded" else state


def _files(run: Path, names: dict[str, str], metrics: list[dict]) -> tuple[dict, dict, dict]:
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    rows = db.execute("SELECT key, node, state, void, step, policy FROM files").fetchall()
    states: dict[str, int] = {}
    honest: dict[str, str] = {}  # an honest worker's file -> its fate
    staleness: dict[str, int] = {}
    for key, node, state, void, step, policy in rows:
        fate = _fate(state, void)
        states[fate] = states.get(fate, 0) + 1
        if names.get(node, "").startswith("worker-"):
            honest[key] = fate
        if state == "trained":
            s = str(step - policy)
            staleness[s] = staleness.get(s, 0) + 1
    said = _submitted(run / "logs")
    ended = ("trained", "stale", "rejected", "voided")
    queued = ("pending", "accepted", "consumed")  # still in the queue when the run ended
    honest_states: dict[str, int] = {}
    for fate in honest.values():
        honest_states[fate] = honest_states.get(fate, 0) + 1
    # rejected, voided or not (an honest node wrongly ejected has its other files voided)
    honest_states["rejected"] = sum(
        s == "rejected" and names.get(n, "").startswith("worker-") for _, n, s, *_ in rows
    )
    # an honest file is lost if a worker says it submitted it (its log) or the ledger has
    # it past its upload, and the ledger does not say what became of it (or lacks it)
    uploaded = said | {k for k, f in honest.items() if f != "uploading"}
    files = {
        "generated": len(rows),
        "accepted": sum(states.get(s, 0) for s in ("accepted", "consumed", "trained")),
        "trained": states.get("trained", 0),
        "stale": states.get("stale", 0),
        "dropped_no_signal": sum(m.get("dropped_groups", 0) for m in metrics),
        "rejected": states.get("rejected", 0),
        "voided": states.get("voided", 0),
        "unused_at_end": sum(honest_states.get(s, 0) for s in queued),
        "lost": sum(honest.get(k) not in ended + queued for k in uploaded),
        "submitted_by_workers": len(said),
        "abandoned_uploads": sum(f == "uploading" and k not in said for k, f in honest.items()),
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
        # many slow workers: small files, and as much work out as async_level allows
        f"worker.groups_per_file={a.groups_per_file}",
    ]  # fmt: skip
    batch = load_config(config, overrides).trainer.batch_groups
    overrides.append(f"worker.max_pending_groups={a.batches_out * batch}")
    cfg = load_config(config, overrides)
    links = {f"worker-{i}": LINKS[i % len(LINKS)] for i in range(honest)}
    links |= {f"cheater-{i}": LINKS[i % len(LINKS)] for i in range(a.cheaters)}
    # relays are rented servers on 1 Gbit/s; the trainer (origin) is on 100 Mbit/s
    links |= {"relay": 1000, "trainer": 100, "orchestrator": 100, "validator": 100}
    layout = Layout(links=links, cpus={"worker": a.worker_cpu, "cheater": a.worker_cpu},
                    weights=WEIGHTS, fanout=max(1, a.relays // (2 ** (a.levels - 1))),
                    levels=a.levels)  # fmt: skip
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
        "honest_files_rejected": honest_states["rejected"],
        "cheaters": a.cheaters,
        "cheaters_ejected": sum(ledger.get(k) in ("ejected", "banned") for k in cheater_keys),
        # a cheater that never got work (a slow link: its policy always a step behind,
        # orchestrator.work_slack_steps) made nothing to judge, and gained nothing
        "cheaters_given_work": sum(
            bool(db.execute("SELECT 1 FROM assignments WHERE node = ?", (k,)).fetchone())
            for k in cheater_keys
        ),
        "weights_lag_s": lags,
        "origin_bytes_out": int(origin_mb * 1e6),
        "bytes_delivered": int(delivered_mb * 1e6),
        "orchestrator_p99_ms": _p99_ms(chaos.scrapes),
        "orchestrator_p99_ms_by_route": _routes(chaos.scrapes),
        "validator_backlog_max": _backlog(chaos.scrapes),
        "cpu_s_by_role": _cpu_by_role(chaos.cpu),
        "staleness_histogram": staleness,
        "heldout_accuracy": {
            "before": evals.get("start_model", {}).get("accuracy"),
            "after": evals.get("final_model", {}).get("accuracy"),
        },
        # greedy mean reward on the same problems (1 - normalised edit distance): on this
        # tiny model exact reversals move little in minutes (docs/results.md, the default run)
        "heldout_reward": {
            "before": evals.get("start_model", {}).get("mean_reward"),
            "after": evals.get("final_model", {}).get("mean_reward"),
        },
    }
    if a.costs:
        out["plan"] = predicted(a, cfg, layout, out)
    tl = _timeline(run, chaos, layout)
    (run / "timeline.json").write_text(json.dumps(tl))
    plot_timeline(tl, run / "timeline.png")
    if a.plot:
        shutil.copy(run / "timeline.png", a.plot)
    (run / "swarm_scale.json").write_text(json.dumps(out))
    print(json.dumps(out))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
