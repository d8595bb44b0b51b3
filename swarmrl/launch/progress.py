"""What `swarmrl rl` shows while the swarm runs and when it ends.

One status line per trainer step (rewritten in place on a terminal): step,
reward, difficulty level, fraction of groups with signal, staleness, throughput, live workers, weights lag and, with
validators, the verdicts: honest files accepted and cheaters' files rejected.
The sources are files of the run directory: metrics.jsonl (trainer),
weights_latency.jsonl (SHARDCAST clients) and verdicts.jsonl (validators);
node keys are mapped to process names through nodes/<name>/node.pub.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from swarmrl.config import RunConfig
from swarmrl.launch import heldout
from swarmrl.launch.report import read_metrics


def _fmt_s(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 60}m{s % 60:02d}s"


def _jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being appended right now
            continue
    return out


def weights_lag(run: Path, last: int = 8) -> float | None:
    """Mean seconds from publish to a node having the version, over the last rows."""
    rows = _jsonl(run / "weights_latency.jsonl")
    for node in (run / "nodes").glob("*/weights_latency.jsonl"):
        rows += _jsonl(node)
    rows = sorted(rows, key=lambda r: r["time"])[-last:]
    return sum(r["latency_s"] for r in rows) / len(rows) if rows else None


def cheater_nodes(run: Path) -> set[str]:
    return {p.read_text().strip() for p in (run / "nodes").glob("cheater-*/node.pub")}


def verdict_counts(run: Path) -> dict:
    """Accepted and rejected files, honest nodes and cheaters apart, and the failing checks."""
    cheaters = cheater_nodes(run)
    c = Counter()
    checks = Counter()
    for v in _jsonl(run / "verdicts.jsonl"):
        who = "cheater" if v["node"] in cheaters else "honest"
        c[(who, v["accepted"])] += 1
        if not v["accepted"]:
            checks[f"{who}:{v['check']}"] += 1
    return {
        "honest_accepted": c[("honest", True)],
        "honest_rejected": c[("honest", False)],
        "cheater_accepted": c[("cheater", True)],
        "cheater_rejected": c[("cheater", False)],
        "checks": dict(checks),
    }


def _verdict_text(run: Path) -> str:
    v = verdict_counts(run)
    honest = v["honest_accepted"] + v["honest_rejected"]
    text = f"honest files accepted {v['honest_accepted']}/{honest}"
    cheats = v["cheater_accepted"] + v["cheater_rejected"]
    if cheats:
        text += f", cheater files rejected {v['cheater_rejected']}/{cheats}"
    return text


_LEDGER_CLIENT = None  # one client for the progress line's polls: one TLS context, kept


def fetch_ledger(url: str) -> dict | None:
    import httpx

    global _LEDGER_CLIENT
    if _LEDGER_CLIENT is None:
        _LEDGER_CLIENT = httpx.Client(timeout=2.0)
    try:
        return _LEDGER_CLIENT.get(url.rstrip("/") + "/v1/ledger").json()
    except (httpx.HTTPError, ValueError):  # shown as unreachable; the run goes on
        return None


class Progress:
    """One status line: a rewritten line on a terminal, a line per step otherwise."""

    def __init__(
        self,
        cfg: RunConfig,
        metrics: Path,
        cheats: list[str] | None = None,
        orchestrator: str | None = None,
        t0: float | None = None,
    ):
        """`t0`: when the launch began (default: now)."""
        self.cfg = cfg
        self.orchestrator = orchestrator
        self.metrics = metrics
        self.run = metrics.parent
        self.cheats = cheats or []
        self.tty = sys.stdout.isatty()
        self.shown = 0
        self.t0 = t0 or time.time()
        self.first_step: int | None = None
        self.first_step_s: float | None = None  # since t0, as first seen (a poll late at most)

    def update(self, alive_workers: int) -> None:
        rows = read_metrics(self.metrics)
        if not rows:
            self._starting(alive_workers)
            return
        if rows[-1]["step"] == self.shown:
            return
        last = rows[-1]
        if self.first_step is None:
            self.first_step = last["step"]
            self.first_step_s = time.time() - self.t0
        done_here = [r for r in rows if r["step"] >= self.first_step]
        if len(done_here) >= 2:  # the pace of the steps since this launch's first one,
            span = done_here[-1]["elapsed_s"] - done_here[0]["elapsed_s"]  # not its start
            per_step = span / (len(done_here) - 1)
        else:
            per_step = time.time() - self.t0
        eta = per_step * (self.cfg.trainer.steps - last["step"])
        if self.cfg.trainer.max_minutes:  # the run also ends at this much training time
            eta = min(eta, max(0.0, 60 * self.cfg.trainer.max_minutes - last["elapsed_s"]))
        samples_s = sum(r["samples"] for r in rows) / max(last["elapsed_s"], 1e-9)
        lag = weights_lag(self.run)
        lag_s = f" | weights lag {lag:.2f}s" if lag is not None else ""
        if self.cfg.validator.enabled:
            checked = f" | {_verdict_text(self.run)}{self._ledger_text()}"
        else:
            checked = f" | rejected {sum(r['rejected_files'] for r in rows)}"
        line = (
            f"step {last['step']}/{self.cfg.trainer.steps} of the budget | reward {last['reward']:.3f} "
            f"(first {rows[0]['reward']:.3f}) | level {last.get('level', 0)} | "
            f"signal {last.get('signal_fraction', 1.0):.2f} | staleness {last['staleness']:.2f} | "
            f"{samples_s:.1f} samples/s | workers {alive_workers}/{self.cfg.launcher.workers}"
            f"{checked}{lag_s} | ETA {_fmt_s(eta)}"
        )
        self.shown = last["step"]
        if self.tty:
            print("\r" + line.ljust(140), end="", flush=True)
        else:
            print(line, flush=True)

    def _starting(self, alive_workers: int) -> None:
        """Before the first step: what is happening, and for how long (once per second on
        a terminal, once otherwise)."""
        if self.shown == -1 and not self.tty:
            return
        line = (
            f"starting: {_fmt_s(time.time() - self.t0)} | processes load the model, workers "
            f"generate, the trainer waits for {self.cfg.trainer.batch_groups} groups with "
            f"signal | workers {alive_workers}/{self.cfg.launcher.workers}"
        )
        self.shown = -1
        if self.tty:
            print("\r" + line.ljust(140), end="", flush=True)
        else:
            print(line, flush=True)

    def _ledger_text(self) -> str:
        """Ejected nodes and stake slashed, from the orchestrator's public ledger."""
        if not self.orchestrator:
            return ""
        led = fetch_ledger(self.orchestrator)
        if led is None:
            return " | orchestrator unreachable"
        out = [n for n in led["nodes"] if n["state"] in ("ejected", "banned")]
        if not out:
            return ""
        slashed = sum(n["slashed"] for n in led["nodes"])
        return f" | ejected {len(out)}, slashed {slashed:.0f}"

    def close(self) -> None:
        if self.tty:
            print(flush=True)


def samples_per_s(rows: list[dict]) -> float:
    """Samples trained on per second of trainer time over rows[1:] (rows[0] marks where
    the span starts)."""
    if len(rows) < 2:
        return 0.0
    span = rows[-1]["elapsed_s"] - rows[0]["elapsed_s"]
    return sum(r["samples"] for r in rows[1:]) / max(span, 1e-9)


def run_shape(cfg: RunConfig, rows: list[dict]) -> str:
    """Difficulty reached, the cost per trained group, and throughput at start and end."""
    top = max(r.get("level", 0) for r in rows)
    need = cfg.trainer.batch_groups
    worst = max(r.get("groups_read", need) for r in rows) / need
    signal = sum(r.get("signal_fraction", 1.0) for r in rows) / len(rows)
    text = (
        f"highest difficulty level {top} | groups with signal {signal:.0%} on average, "
        f"worst step read {worst:.1f}x the groups it trained on"
    )
    if len(rows) >= 42:
        text += (
            f" | trained samples/s, steps 2-21: {samples_per_s(rows[:21]):.0f}, "
            f"last 20: {samples_per_s(rows[-21:]):.0f}"
        )
    return text


def ledger_line(ledger: dict) -> str:
    """Nodes by state, files accepted, and the cheaters the orchestrator caught."""
    nodes = [n for n in ledger["nodes"] if n["role"] == "worker"]
    states = Counter(n["state"] for n in nodes)
    text = f"ledger: {len(nodes)} workers (" + ", ".join(
        f"{k} {v}" for k, v in sorted(states.items())
    )
    text += f"), {sum(n['accepted'] for n in nodes)} files accepted"
    caught = [n for n in nodes if n["state"] == "ejected"]
    if caught:
        text += (
            f", {len(caught)} ejected with {sum(n['void'] for n in caught)} contributions voided"
            f" and {sum(n['slashed'] for n in caught):.0f} stake slashed"
        )
    return text


def summary_lines(
    cfg: RunConfig,
    run: Path,
    ledger: dict | None = None,
    url: str | None = None,
    first_step_s: float | None = None,
) -> list[str]:
    """The closing lines of a finished run (`ledger`: the orchestrator's, read before it
    stopped; `url`: the orchestrator, still up, which takes the final held-out score;
    `first_step_s`: seconds from the launch to the first step this launch saw)."""
    from swarmrl.tracking import locations

    out = []
    rows = read_metrics(run / "metrics.jsonl")
    if rows:
        k = min(5, len(rows))
        first = sum(r["reward"] for r in rows[:k]) / k
        last = sum(r["reward"] for r in rows[-k:]) / k
        since = f", the first {first_step_s:.0f}s after the launch" if first_step_s else ""
        out.append(
            f"{len(rows)} steps in {rows[-1]['elapsed_s']:.0f}s of training{since}: mean "
            f"reward first {k} steps {first:.3f}, last {k} steps {last:.3f} ({last - first:+.3f})"
        )
        out.append(run_shape(cfg, rows))
    lag = weights_lag(run, last=1 << 30)
    if lag is not None:
        out.append(f"weights reached nodes {lag:.2f}s after publish on average")
    if cfg.validator.enabled:
        v = verdict_counts(run)
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(v["checks"].items()))
        out.append(
            f"validation: {_verdict_text(run)}" + (f" (failed: {reasons})" if reasons else "")
        )
    if ledger is not None:
        out.append(ledger_line(ledger))
    out.extend(heldout.after(cfg, run, url))
    out.append(f"metrics {run / 'metrics.jsonl'}, plot {run / 'report.png'}, model {run / 'final'}")
    if url and cfg.orchestrator.dashboard:
        out.append(f"dashboard (while the orchestrator runs): {url}/dashboard")
    out.extend(locations(cfg))
    return out
