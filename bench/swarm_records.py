"""What bench/swarm_scale.py reads from a finished run, and its timeline plot: CPU
seconds from /proc, the orchestrator's latency histogram, the validators' backlog,
the weights lag per tree level, each file's fate, the timeline (see swarm_scale.py's
docstring for the definitions)."""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from datetime import datetime
from pathlib import Path

from swarmrl.procs import cpu_s  # noqa: E402,F401  (re-exported: the bench reads it here)

SUBMITTED = re.compile(r"step \d+ policy \d+: .* -> (rollouts/\S+)")
LAG = re.compile(r"version (\d+): ([\d.]+) MB in [\d.]+s \(([\d.]+)s after publish\)")


def cpu_by_role(cpu: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU seconds by role (sampled every 2 s: a process's last 2 s before it died are
    missing)."""
    roles: dict[str, float] = {}
    for (name, _), used in cpu.items():
        role = name.split("-")[0]
        roles[role] = round(roles.get(role, 0.0) + used, 1)
    return dict(sorted(roles.items()))


def histogram(
    text: str, route: str | None = None, name: str = "swarmrl_service_seconds"
) -> tuple[dict[float, float], float]:
    """A time histogram's cumulative buckets over all routes (or `route`'s), and its
    count: the service time (orchestrator/asgi.py: from the request whole to its
    answer), or with `name="swarmrl_request_seconds"` from its headers on."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        m = re.match(name + r"_bucket\{([^}]*)\} ([\d.e+]+)", line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1])) if m else {}
        if m and (route is None or labels.get("route") == route):
            le = float("inf") if labels["le"] == "+Inf" else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + float(m[2])
    return buckets, buckets.get(float("inf"), 0.0)


def routes(scrapes: list[dict], name: str = "swarmrl_service_seconds") -> dict[str, float | None]:
    """p99 per route over the orchestrator's last life (where a slow p99 comes from)."""
    if not scrapes:
        return {}
    text = scrapes[-1]["text"]
    names = sorted(set(re.findall(name + r'_bucket\{[^}]*route="([^"]+)"', text)))
    return {r: quantile(histogram(text, r, name)[0], 0.99) for r in names}


def p99_ms(scrapes: list[dict], name: str = "swarmrl_service_seconds") -> float | None:
    """p99 over every lifetime of the orchestrator: the last scrape before each restart
    (a count that drops is a restart), summed; the 99th percentile read off the
    buckets (orchestrator/asgi.py: 10 ms apart from 10 to 50 ms)."""
    lives, last = [], None
    for s in scrapes:
        h, n = histogram(s["text"], name=name)
        if last is not None and n < last[1]:
            lives.append(last)
        last = (h, n)
    if last:
        lives.append(last)
    total: dict[float, float] = {}
    for h, _ in lives:
        for le, c in h.items():
            total[le] = total.get(le, 0.0) + c
    return quantile(total, 0.99)


def quantile(cumulative: dict[float, float], q: float) -> float | None:
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


def backlog(scrapes: list[dict]) -> int:
    most = 0
    for s in scrapes:
        m = re.search(r'swarmrl_files\{state="pending"\} ([\d.e+]+)', s["text"])
        most = max(most, int(float(m[1]))) if m else most
    return most


def quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None, "n": 0}
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 2),
            "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 2), "n": len(xs)}  # fmt: skip


def lags(logs: Path, layout, relays: int) -> tuple[dict, float, float]:
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
    return {k: quantiles(v) for k, v in sorted(by_level.items())}, origin_mb, delivered_mb


def log_time(line: str) -> float | None:
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def timeline(run: Path, chaos, layout) -> dict:
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
            m, t = LAG.search(line), log_time(line)
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


def submitted(logs: Path) -> set[str]:
    """The files honest workers say they uploaded and submitted (their logs)."""
    keys: set[str] = set()
    for log in logs.glob("worker-*.log"):
        keys.update(SUBMITTED.findall(log.read_text(errors="replace")))
    return keys


def file_fate(state: str, void: int) -> str:
    """A file's fate as the JSON counts it: `discarded` is a stale file whose object is
    deleted (orchestrator/files.py), a void one belongs to an ejected node."""
    return "voided" if void else "stale" if state == "discarded" else state


def file_fates(run: Path, names: dict[str, str], metrics: list[dict]) -> tuple[dict, dict, dict]:
    db = sqlite3.connect(run / "orchestrator" / "state.sqlite")
    rows = db.execute("SELECT key, node, state, void, step, policy FROM files").fetchall()
    states: dict[str, int] = {}
    honest: dict[str, str] = {}  # an honest worker's file -> its fate
    staleness: dict[str, int] = {}
    for key, node, state, void, step, policy in rows:
        fate = file_fate(state, void)
        states[fate] = states.get(fate, 0) + 1
        if names.get(node, "").startswith("worker-"):
            honest[key] = fate
        if state == "trained":
            s = str(step - policy)
            staleness[s] = staleness.get(s, 0) + 1
    said = submitted(run / "logs")
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
