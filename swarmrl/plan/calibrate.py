"""The planner's costs, measured: from the records of a finished run (`from_run`), or
by running a short one on this machine first (`measure`).

What each cost is read from (all written by the run's own processes):

- `file_s`: the median seconds a worker took for one file (its log's "in N s"),
  times the cores it had (1 on loopback; a share in the emulated swarm), and the
  groups in a file (`groups`: the file key's `-gN`);
- `train_s`: the median of the trainer's update seconds (metrics.jsonl `train_s`);
- `validate_s`: the median of the validators' seconds per file (verdicts.jsonl);
- `submit_s`: the median seconds from a file's upload grant to its submission (the
  ledger), times the worker's cores: the upload and the requests around it;
- `load_s`: the median seconds a worker took to load a version it had downloaded;
- `start_s`: the median seconds from a worker's start to its registration;
- `fetch_s_per_mb`: the median seconds per MB of a worker's downloads of versions
  (on loopback the link is not the limit: its CPU is), times its cores;
- `version_mb`: the mean of what each version sent (published.jsonl: the patch where
  one was kept, else the whole version);
- `file_mb`: the mean rollout file (the orchestrator's ledger);
- `signal`: the share of the groups the trainer read that had signal.

Not measured: the orchestrator's service time per request (`request_ms`, from
bench/orchestrator_load.py; the planner reports the load it would put on it).

A run of the emulated swarm (bench/swarm_scale.py) also leaves `cpu.jsonl`, every
node's CPU seconds every 2 s. Its seconds are CPU time, not the wall time that
contention stretches, so where it is there the CPU costs and the latencies come
from it instead (plan/under_load.py): measured with every process of the swarm on
the machine at once, over the steady part of the run.
"""

from __future__ import annotations

import json
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from swarmrl.plan.model import Costs
from swarmrl.plan.records import FETCHED, FILE, LOADED, log_time, read_jsonl
from swarmrl.plan.under_load import under_load


def _median(xs: list[float], what: str, run: Path) -> float:
    if not xs:
        raise ValueError(f"{run}: no record of {what}: a run with at least 2 steps is needed")
    return statistics.median(xs)


def from_run(run: Path, worker_cores: float = 1.0) -> Costs:
    """Costs read from run directory `run` (see the module's docstring); a worker's
    seconds count `worker_cores` cores each (its share in an emulated swarm)."""
    run = Path(run)
    if not (run / "metrics.jsonl").exists():
        raise ValueError(f"{run}: no metrics.jsonl, not a run directory")
    metrics = read_jsonl(run / "metrics.jsonl")
    files, loads, starts, groups, fetches = [], [], [], [], []
    for log in sorted((run / "logs").glob("worker-*.log")):
        joined = None
        for line in log.read_text(errors="replace").splitlines():
            if m := FILE.search(line):
                files.append(float(m[1]) * worker_cores)
                groups.append(int(m[2]))
            elif (m := FETCHED.search(line)) and int(m[1]) > 0 and float(m[2]) > 0:
                fetches.append(float(m[3]) / float(m[2]) * worker_cores)
            elif (m := LOADED.search(line)) and int(m[1]) > 0:
                loads.append(float(m[2]) * worker_cores)
            elif " joining run " in line:
                joined = log_time(line)
            elif " registered: " in line and joined is not None:
                t = log_time(line)
                starts.append(t - joined) if t is not None else None
                joined = None
    checks = [v["seconds"] for v in read_jsonl(run / "verdicts.jsonl") if "seconds" in v]
    published = read_jsonl(run / "published.jsonl")
    sent = [
        p["full_bytes"] if p.get("patch_dropped", True) or not p.get("patch_bytes")
        else p["patch_bytes"]
        for p in published
    ]  # fmt: skip
    db = sqlite3.connect(f"file:{run / 'orchestrator' / 'state.sqlite'}?mode=ro", uri=True)
    try:
        (size,) = db.execute("SELECT AVG(size) FROM files").fetchone()
        submits = [
            (b - a) * worker_cores
            for a, b in db.execute(
                "SELECT created, submitted FROM files WHERE submitted IS NOT NULL"
            ).fetchall()
        ]
    finally:
        db.close()
    read = sum(m.get("groups", 0) + m.get("dropped_groups", 0) for m in metrics)
    dropped = sum(m.get("dropped_groups", 0) for m in metrics)
    costs = Costs(
        file_s=round(_median(files, "a worker's file", run), 3),
        train_s=round(
            _median([m["train_s"] for m in metrics if "train_s" in m], "updates", run), 3
        ),
        validate_s=round(_median(checks, "a validator's check", run), 3),
        load_s=round(statistics.median(loads), 3) if loads else 0.0,
        submit_s=round(statistics.median(submits), 3) if submits else 0.0,
        version_mb=round(_median(sent, "a published version", run) / 1e6, 3),
        start_s=round(statistics.median(starts), 1) if starts else 0.0,
        fetch_s_per_mb=round(statistics.median(fetches), 4) if fetches else 0.0,
        file_mb=round((size or 0) / 1e6, 4),
        signal=round(1 - dropped / read, 3) if read else 1.0,
        groups=round(statistics.median(groups)),
        measured_on=f"{run} ({platform.node()}, {platform.processor() or platform.machine()})",
    )
    if (run / "cpu.jsonl").exists():
        return under_load(run, costs)
    return costs


def measure(
    config: str, steps: int = 8, keep: Path | None = None, groups_per_file: int = 2
) -> Costs:
    """Run `config` on this machine with one worker and one validator for `steps`
    steps (loopback, a full core each), with files of `groups_per_file` groups (the
    size the model's swarm uses: a file's cost has a fixed part, so costs measured on
    files of 8 groups and scaled to 2 were a quarter of what files of 2 cost), and
    read the costs from its records; and
    `idle_cores`, the CPU a worker process burns besides its files (heartbeats,
    version polls, its threads): its CPU time from the first step to its exit
    (/proc, sampled every 0.5 s), less its files' seconds, over that time."""
    import time

    where = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="swarmrl-calibrate-"))
    argv = [sys.executable, "-m", "swarmrl", "rl", "--config", config, "--fresh",
            f"runs_dir={json.dumps(str(where))}", "name=calibrate", f"trainer.steps={steps}",
            "launcher.workers=1", "validator.count=1", "validator.enabled=true",
            "validator.sample_rate=1.0", "shardcast.relays=1", "launcher.eval_problems=0",
            f"worker.groups_per_file={groups_per_file}",
            # one worker on a whole core makes files of 2 groups faster than the default
            # 60 upload URLs a minute: refused, each was made again (the CPU it burnt
            # was read as idle_cores, 0.8 of a core)
            "orchestrator.uploads_per_minute=100000"]  # fmt: skip
    run = where / "calibrate"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    first: tuple[float, float] | None = None  # (time, worker CPU s) at the first step
    last, since = (0.0, 0.0), 0.0
    while proc.poll() is None:
        time.sleep(0.5)
        cpu = _worker_cpu_s(run)
        if cpu is None:
            continue
        last = (time.monotonic(), cpu)
        if first is None and (run / "metrics.jsonl").exists():
            first, since = last, time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the calibration run failed ({proc.returncode}); logs in {where}")
    costs = from_run(run)
    if first is not None and last[0] > first[0]:
        files = _files_after(run, since)
        spare = last[1] - first[1] - files * (costs.file_s + costs.submit_s)
        costs.idle_cores = round(max(0.0, spare) / (last[0] - first[0]), 4)
    return costs


def _worker_cpu_s(run: Path) -> float | None:
    """CPU seconds the run's worker processes have used (None: none is running)."""
    import os

    marker = f"{run}/nodes/worker-".encode()
    total, seen = 0.0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes():
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seen = True
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total if seen else None


def _files_after(run: Path, since: float) -> int:
    """Files the workers finished after wall-clock time `since` (their logs)."""
    count = 0
    for log in (run / "logs").glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            t = log_time(line)
            if FILE.search(line) and t is not None and t >= since:
                count += 1
    return count
