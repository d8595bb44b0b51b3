"""Where problems come from: generated from the seed, or read from a file.

A `TaskSource` maps (split, index, level) to a Task. Generated sources are
infinite and take the curriculum's difficulty level; file sources (parquet or
JSONL of task records) wrap indices modulo their size, ignore the level (the
curriculum weights their problems instead), and use every record for both
splits (a file is the user's choice of problems).
"""

from __future__ import annotations

import json
from pathlib import Path

from swarmrl.config import TaskConfig
from swarmrl.tasks.generators import GENERATORS
from swarmrl.tasks.schema import Task, TaskError, parse_task
from swarmrl.tasks.verifiers import VERIFIERS


class TaskSource:
    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.records: list[Task] | None = None
        if cfg.dataset:
            self.records = load_task_file(Path(cfg.dataset))

    @property
    def n_records(self) -> int | None:
        """Records of a file source; None for a generated one."""
        return None if self.records is None else len(self.records)

    def problem_index(self) -> dict[str, list[int]] | None:
        """Problem id -> record indices of a file source (None for a generated one)."""
        if self.records is None:
            return None
        out: dict[str, list[int]] = {}
        for i, t in enumerate(self.records):
            out.setdefault(t.problem_id, []).append(i)
        return out

    def get(self, split: str, index: int, level: int = 0) -> Task:
        if self.records is not None:
            return self.records[index % len(self.records)]
        return GENERATORS[self.cfg.name](self.cfg, split, index, self.seed, level)


def load_task_file(path: Path) -> list[Task]:
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path} line {i + 1}: not valid JSON: {e}") from None
    else:
        raise TaskError(f"task file {path}: expected .parquet or .jsonl")
    tasks = [parse_task(r, where=f"{path} record {i}") for i, r in enumerate(rows)]
    if not tasks:
        raise TaskError(f"task file {path} holds no records")
    for i, t in enumerate(tasks):
        if t.task_type not in VERIFIERS:
            raise TaskError(
                f"{path} record {i}: field 'task_type': no verifier for '{t.task_type}'"
            )
    return tasks
