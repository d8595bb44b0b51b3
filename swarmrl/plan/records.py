"""What the planner reads from a run's records: the log lines it matches and the
readers both calibrations (plan/calibrate.py, plan/under_load.py) share."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

# a worker's file: "step N policy P: S samples, ... in X s -> KEY-gG.parquet"
FILE = re.compile(r"step \d+ policy \d+: \d+ samples, .* in ([\d.]+)s -> \S+-g(\d+)\.parquet")
# a SHARDCAST client's download: "version N: M MB in X s ("
FETCHED = re.compile(r"version (\d+): ([\d.]+) MB in ([\d.]+)s \(")
LOADED = re.compile(r"loaded policy version (\d+) in ([\d.]+)s")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []


def log_time(line: str) -> float | None:
    """The time a log line was written (its logging timestamp), or None."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None
