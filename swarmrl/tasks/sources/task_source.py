"""Where problems come from: generated from the seed, or read from a file.

A `TaskSource` maps (split, index, level) to a Task. Generated sources are
infinite and take the curriculum's difficulty level (reasoning-gym families,
tasks/sources/gym.py, are generated too but ignore the level); record sources (a
parquet or JSONL file of task records, a Hugging Face `datasets` directory, or
the rows of a verifiers taskset, tasks/sources/environments.py) wrap indices modulo
their size, ignore the level (the curriculum weights their problems instead),
and use every record for both splits (they are the user's choice of problems).
"""

from __future__ import annotations

import json
from pathlib import Path

from swarmrl.config import TaskConfig
from swarmrl.tasks.graders.registry import VERIFIERS, info_error
from swarmrl.tasks.schema import Task, TaskError, parse_task
from swarmrl.tasks.sources.generated import GENERATORS


class TaskSource:
    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.records: list[Task] | None = None
        if cfg.dataset:
            self.records = load_task_file(Path(cfg.dataset))
        elif cfg.name == "verifiers":
            from swarmrl.tasks.sources.environments import records

            self.records = records(cfg)
        elif cfg.name == "reasoning_gym":
            from swarmrl.tasks.sources.gym import check_config

            check_config(cfg)

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
        task = self._get(split, index, level)
        if self.cfg.instruction:
            return task.model_copy(update={"prompt": f"{task.prompt}\n{self.cfg.instruction}"})
        return task

    def _get(self, split: str, index: int, level: int) -> Task:
        if self.records is not None:
            return self.records[index % len(self.records)]
        if self.cfg.name == "reasoning_gym":
            from swarmrl.tasks.sources.gym import gym_task

            return gym_task(self.cfg, split, index, self.seed, level)
        return GENERATORS[self.cfg.name](self.cfg, split, index, self.seed, level)


def _hf_rows(path: Path) -> list[tuple[str, dict]]:
    """The rows of a directory written by `datasets` (`Dataset.save_to_disk`; for a
    `DatasetDict`, its `train` split)."""
    if not (path / "state.json").is_file() and not (path / "dataset_dict.json").is_file():
        raise TaskError(f"{path}: a directory, but not one saved by datasets' save_to_disk")
    try:
        import datasets
    except ImportError:
        raise TaskError(
            f"{path}: reading it needs the datasets package: pip install datasets"
        ) from None
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises several types for damaged directories
        raise TaskError(f"{path}: not a readable datasets directory: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise TaskError(f"{path}: a DatasetDict without a 'train' split (has {sorted(ds)})")
        path, ds = path / "train", ds["train"]
    return [(f"{path} row {i}", dict(r)) for i, r in enumerate(ds)]


def load_task_file(path: Path) -> list[Task]:
    """Every record of a parquet or JSONL file or a datasets directory, validated;
    errors name the file, the line (JSONL, counting from 1) or row (parquet and
    datasets, from 0) and the field."""
    if path.is_dir():
        rows = _hf_rows(path)
    elif not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for damaged files
            raise TaskError(f"{path}: not a readable parquet file: {e}") from None
        rows = [(f"{path} row {i}", r) for i, r in enumerate(table.to_pylist())]
    elif path.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TaskError(f"{path} line {n}: not valid JSON: {e}") from None
                if not isinstance(record, dict):
                    raise TaskError(f"{path} line {n}: a record must be a JSON object")
                rows.append((f"{path} line {n}", record))
    else:
        raise TaskError(
            f"task file {path}: expected .parquet, .jsonl or a directory saved by datasets"
        )
    tasks = [parse_task(r, where=where) for where, r in rows]
    if not tasks:
        raise TaskError(f"task file {path} holds no records")
    for (where, _), t in zip(rows, tasks, strict=True):
        if t.task_type not in VERIFIERS:
            raise TaskError(
                f"{where}: field 'task_type': no verifier for '{t.task_type}'"
                f" (known: {', '.join(sorted(VERIFIERS))})"
            )
        why = info_error(t)
        if why is not None:
            raise TaskError(f"{where}: {why}")
    return tasks
