"""The planner's costs as an emulated swarm spends them: CPU time from its record,
latencies from its logs, all with every process of the swarm on one machine.

bench/swarm_scale.py leaves in its run directory `cpu.jsonl` (every 2 s: the time,
the trainer's step and each node's CPU seconds so far) and `links.json` (each
node's link, Mbit/s). CPU seconds are what a process used, not the wall time that
contention stretches, so a cost read here holds at another swarm size on the
same machine, where contention differs: the planner then adds the contention
itself (plan/model.py). What is read, over a steady window (from step 8, and at
least 60 s after the last restart of a relay, a validator, the orchestrator or
the trainer, to 3 steps before the end):

- the workers that ran the whole window: each one's CPU against the versions it
  downloaded, the files it made and the window's length (least squares, no cost
  below zero): the CPU per version (`fetch_s_per_mb`, taking it in and loading
  it), per file (`file_s`, its upload and submission included) and per second
  (`idle_cores`); `start_s`, a worker's CPU when it registered;
- `train_s`: the trainer's CPU per step, or the update's median seconds if less
  (the update runs on one thread); `publish_s`: the median seconds from an
  update's end (the trainer's log) to its version's publication; `collect_s`:
  from the last file a step trained being accepted (its verdict) to the update's
  start (the trainer's poll, download, check and consumption). Both are seconds
  where the trainer had a core to itself (at the calibration's size), which the
  model spends as its CPU;
- `validate_s`: the validators' CPU per check, less their versions and idle;
- `relay_s_per_mb`: the relays' CPU per MB any node downloaded (relays send and
  take in most of them);
- `orchestrator_s`: the orchestrator's CPU per file the workers made (the
  requests of its assignment, upload, submission, verdict and training);
- `fetch_latency_s`: the median of how much longer the workers' and validators'
  downloads took than their bytes at their link's rate (the requests before the
  bytes, TCP's ramp after an idle connection).
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from pathlib import Path

import numpy as np

from swarmrl.plan.model import Costs
from swarmrl.plan.records import FETCHED, FILE, log_time, read_jsonl

# the first line each kind of process logs when it starts
STARTS = {"worker": " joining run ", "validator": " started on ", "relay": "relay serving",
          "orchestrator": "orchestrator of run", "trainer": " computes on "}  # fmt: skip
CHECKED = re.compile(r" (accepted|REJECTED) rollouts/\S+: ")
TRAINED = re.compile(r"INFO step (\d+) .* train ([\d.]+)s$")
SETTLE_S = 60.0  # after a restart, what a process spends starting is not its steady cost


class _Window:
    """The steady part of an emulated run's record, and what each node did in it."""

    def __init__(self, run: Path):
        self.run = run
        self.samples = read_jsonl(run / "cpu.jsonl")
        self.logs = {
            f.stem: f.read_text(errors="replace").splitlines() for f in (run / "logs").glob("*.log")
        }
        self.starts = {n: self._times(n, STARTS.get(n.split("-")[0], "\0")) for n in self.logs}
        settled = max((ts[-1] + SETTLE_S for n, ts in self.starts.items()
                       if ts and not n.startswith(("worker", "cheater"))), default=0.0)  # fmt: skip
        last = max((x["step"] for x in self.samples), default=0)
        try:
            self.a = next(x for x in self.samples if x["step"] >= 8 and x["time"] >= settled)
            self.b = [x for x in self.samples if x["step"] <= last - 3][-1]
        except (StopIteration, IndexError):
            raise ValueError(f"{run}: no steady window in its CPU record (too few steps)") from None
        self.span, self.steps = self.b["time"] - self.a["time"], self.b["step"] - self.a["step"]
        if self.span < 30 or self.steps < 5:
            raise ValueError(
                f"{run}: the steady window is {self.span:.0f} s, {self.steps} steps: too short"
            )

    def _times(self, node: str, marker: str) -> list[float]:
        return [t for x in self.logs[node] if marker in x if (t := log_time(x)) is not None]

    def within(self, t: float | None) -> bool:
        return t is not None and self.a["time"] <= t <= self.b["time"]

    def cpu(self, node: str) -> float:
        return self.b["cpu_s"].get(node, 0.0) - self.a["cpu_s"].get(node, 0.0)

    def matches(self, node: str, pattern: re.Pattern) -> list[re.Match]:
        """`pattern` in `node`'s log lines of the window."""
        return [m for x in self.logs.get(node, [])
                if (m := pattern.search(x)) and self.within(log_time(x))]  # fmt: skip

    def role(self, prefix: str) -> list[str]:
        return [n for n in self.logs if n.startswith(prefix) and n in self.b["cpu_s"]]

    def steady_workers(self) -> list[str]:
        """Workers that started once and registered before the window."""
        steady = []
        for n in self.role("worker-"):
            joined = self._times(n, " registered: ")
            if len(self.starts[n]) == 1 and joined and joined[-1] < self.a["time"]:
                steady.append(n)
        return steady


def under_load(run: Path, costs: Costs) -> Costs:
    """`costs` (read from the run's records, plan/calibrate.py) with what the
    module's docstring lists taken from the emulated run's record instead."""
    w = _Window(Path(run))
    per_version = _workers(w, costs)
    _trainer(w, costs)
    validators = w.role("validator-")
    checks = sum(len(w.matches(n, CHECKED)) for n in validators)
    if checks:
        own = sum(w.cpu(n) - len(w.matches(n, FETCHED)) * per_version - costs.idle_cores * w.span
                  for n in validators)  # fmt: skip
        costs.validate_s = max(0.0, own) / checks
    moved = sum(float(m[2]) for n in w.logs for m in w.matches(n, FETCHED))
    if moved:
        costs.relay_s_per_mb = sum(w.cpu(n) for n in w.role("relay-")) / moved
    links = _jsonl_dict(w.run / "links.json")
    beyond = [float(m[3]) - float(m[2]) * 8 / links[n]
              for n in w.steady_workers() + validators if links.get(n)
              for m in w.matches(n, FETCHED)]  # fmt: skip
    if beyond:
        costs.fetch_latency_s = statistics.median(beyond)
    made = sum(len(w.matches(n, FILE)) for n in w.role("worker-"))
    costs.orchestrator_s = sum(w.cpu(n) for n in w.role("orchestrator")) / max(1, made)
    for k in ("file_s", "train_s", "validate_s", "start_s", "idle_cores", "publish_s",
              "collect_s", "fetch_latency_s"):  # fmt: skip
        setattr(costs, k, round(getattr(costs, k), 4))
    for k in ("fetch_s_per_mb", "relay_s_per_mb", "orchestrator_s"):
        setattr(costs, k, round(getattr(costs, k), 6))
    costs.measured_on += f"; CPU under load, steps {w.a['step']}-{w.b['step']} ({w.span:.0f} s)"
    return costs


def _jsonl_dict(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _workers(w: _Window, costs: Costs) -> float:
    """The workers' costs (see the module); returns the CPU per version taken."""
    steady = w.steady_workers()
    if len(steady) < 6:
        raise ValueError(f"{w.run}: {len(steady)} workers ran the whole window; 6 are needed")
    rows = np.array(
        [[len(w.matches(n, FETCHED)), len(w.matches(n, FILE)), w.span] for n in steady], float
    )
    used = np.array([w.cpu(n) for n in steady])
    keep = [0, 1, 2]
    while True:  # least squares, without a cost below zero
        coef, *_ = np.linalg.lstsq(rows[:, keep], used, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    per = dict.fromkeys(range(3), 0.0)
    per.update((k, max(0.0, float(c))) for k, c in zip(keep, coef, strict=True))
    costs.file_s, costs.idle_cores = per[1], per[2]
    costs.fetch_s_per_mb, costs.load_s, costs.submit_s = per[0] / costs.version_mb, 0.0, 0.0
    at_start = []
    for n in steady:
        joined = w._times(n, " registered: ")[-1]
        after = next((x for x in w.samples if x["time"] >= joined), None)
        if after is not None and n in after["cpu_s"]:
            at_start.append(after["cpu_s"][n])
    if at_start:
        costs.start_s = statistics.median(at_start)
    return per[0]


def _trainer(w: _Window, costs: Costs) -> None:
    """The trainer's costs (see the module)."""
    ended = {int(m[1]): (log_time(m.string), float(m[2])) for m in w.matches("trainer", TRAINED)}
    if not ended:
        raise ValueError(f"{w.run}: no trainer step logged in the steady window")
    # the update runs on one thread: its CPU is at most its seconds; the rest of the
    # trainer's (collecting, publishing) runs beside it or while it waits
    costs.train_s = min(sum(w.cpu(n) for n in w.role("trainer")) / w.steps,
                        statistics.median(u for _, u in ended.values()))  # fmt: skip
    published = {p["version"]: p["time"] for p in read_jsonl(w.run / "published.jsonl")}
    costs.publish_s = statistics.median(
        published[k] - t for k, (t, _) in ended.items() if k in published
    )
    verdicts = {v["key"]: v["time"] for v in read_jsonl(w.run / "verdicts.jsonl") if "time" in v}
    accepted: dict[int, float] = {}  # step -> when the last file it trained was accepted
    db = sqlite3.connect(f"file:{w.run / 'orchestrator' / 'state.sqlite'}?mode=ro", uri=True)
    try:
        for key, step in db.execute("SELECT key, consumed_step FROM files WHERE consumed_step > 0"):
            if key in verdicts:
                accepted[step] = max(accepted.get(step, 0.0), verdicts[key])
    finally:
        db.close()
    gaps = [t - u - accepted[k] for k, (t, u) in ended.items() if k in accepted]
    costs.collect_s = max(0.0, statistics.median(gaps)) if gaps else 0.0
