"""What `swarmrl rl` shows while the swarm runs and when it ends.

One status line per trainer step (rewritten in place on a terminal): step,
reward, staleness, throughput, live workers, weights lag and, with
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
from swarmrl.report import read_metrics


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
    rows = _jsonl(run / "weights_latency.jsonl")[-last:]
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


class Progress:
    """One status line: a rewritten line on a terminal, a line per step otherwise."""

    def __init__(self, cfg: RunConfig, metrics: Path, cheats: list[str] | None = None):
        self.cfg = cfg
        self.metrics = metrics
        self.run = metrics.parent
        self.cheats = cheats or []
        self.tty = sys.stdout.isatty()
        self.shown = 0
        self.t0 = time.time()
        self.first_step: int | None = None

    def update(self, alive_workers: int) -> None:
        rows = read_metrics(self.metrics)
        if not rows or rows[-1]["step"] == self.shown:
            return
        last = rows[-1]
        if self.first_step is None:
            self.first_step = last["step"]
        done_here = last["step"] - self.first_step + 1
        per_step = (time.time() - self.t0) / max(done_here, 1)
        eta = per_step * (self.cfg.trainer.steps - last["step"])
        samples_s = sum(r["samples"] for r in rows) / max(last["elapsed_s"], 1e-9)
        lag = weights_lag(self.run)
        lag_s = f" | weights lag {lag:.2f}s" if lag is not None else ""
        if self.cfg.validator.enabled:
            checked = f" | {_verdict_text(self.run)}"
        else:
            checked = f" | rejected {sum(r['rejected_files'] for r in rows)}"
        line = (
            f"step {last['step']}/{self.cfg.trainer.steps} | reward {last['reward']:.3f} "
            f"(first {rows[0]['reward']:.3f}) | staleness {last['staleness']:.2f} | "
            f"{samples_s:.0f} samples/s | workers {alive_workers}/{self.cfg.launcher.workers}"
            f"{checked}{lag_s} | ETA {_fmt_s(eta)}"
        )
        self.shown = last["step"]
        if self.tty:
            print("\r" + line.ljust(140), end="", flush=True)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.tty:
            print(flush=True)


def summary_lines(cfg: RunConfig, run: Path) -> list[str]:
    """The closing lines of a finished run."""
    out = []
    rows = read_metrics(run / "metrics.jsonl")
    if rows:
        k = min(5, len(rows))
        first = sum(r["reward"] for r in rows[:k]) / k
        last = sum(r["reward"] for r in rows[-k:]) / k
        out.append(
            f"done in {rows[-1]['elapsed_s']:.0f}s: mean reward first {k} steps {first:.3f}, "
            f"last {k} steps {last:.3f} ({last - first:+.3f})"
        )
    lag = weights_lag(run, last=1 << 30)
    if lag is not None:
        out.append(f"weights reached nodes {lag:.2f}s after publish on average")
    if cfg.validator.enabled:
        v = verdict_counts(run)
        reasons = ", ".join(f"{k} {n}" for k, n in sorted(v["checks"].items()))
        out.append(
            f"validation: {_verdict_text(run)}" + (f" (failed: {reasons})" if reasons else "")
        )
    out.append(f"metrics {run / 'metrics.jsonl'}, plot {run / 'report.png'}, model {run / 'final'}")
    return out
