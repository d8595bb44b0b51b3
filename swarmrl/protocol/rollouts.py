"""Rollout files: one parquet file per upload, one row per completion, whole groups.

The schema (docs/reference/formats.md) is checked exactly on read: a file with
a missing, extra or mistyped column, a list longer than the configured limits,
a group that is not whole, or a non-finite number is rejected with a reason
(`RolloutFileError`). Reading never trusts the file: parquet decoding errors
are turned into the same error, so a hostile file cannot crash the reader.
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("problem_id", pa.string()),
        ("group", pa.int32()),
        ("prompt_tokens", pa.list_(pa.int32())),
        ("completion_tokens", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("reward", pa.float32()),
        ("task_reward", pa.float32()),
        ("length_penalty", pa.float32()),
        ("target_length", pa.int32()),
        ("step", pa.int32()),
        ("policy_step", pa.int32()),
        ("seed", pa.int64()),
        ("temperature", pa.float32()),
        ("proofs", pa.binary()),
        ("node", pa.string()),
        ("task_type", pa.string()),
        ("prompt", pa.string()),
        ("completion", pa.string()),
    ]
)
COLUMNS = SCHEMA.names
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_DECODED_BYTES = 1024 * 1024 * 1024  # all columns, decoded
MAX_FIELD_BYTES = 16 * 1024 * 1024  # one string or binary value


class RolloutFileError(ValueError):
    """A rollout file that must not be trained on; the message says why."""


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 32768
    max_rows: int = 65536
    group_size: int | None = None  # when set, every group must have exactly this many rows


def write_rollouts(rows: list[dict]) -> bytes:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def read_rollouts(data: bytes, limits: Limits = Limits()) -> list[dict]:
    """Parse and validate a rollout file; return its rows."""
    if len(data) > MAX_FILE_BYTES:
        raise RolloutFileError(f"file is {len(data)} bytes, over the {MAX_FILE_BYTES} limit")
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        schema = pf.schema_arrow
    except Exception as e:  # any decoding failure means a corrupt file
        raise RolloutFileError(f"not a readable parquet file: {type(e).__name__}: {e}") from None
    missing = [c for c in COLUMNS if c not in schema.names]
    extra = [c for c in schema.names if c not in COLUMNS]
    if missing or extra:
        raise RolloutFileError(f"schema mismatch: missing columns {missing}, unexpected {extra}")
    for field in SCHEMA:
        got = schema.field(field.name).type
        if got != field.type:
            raise RolloutFileError(f"column '{field.name}' has type {got}, expected {field.type}")
    if pf.metadata.num_rows > limits.max_rows:
        raise RolloutFileError(f"{pf.metadata.num_rows} rows, over the limit of {limits.max_rows}")
    if pf.metadata.num_rows == 0:
        raise RolloutFileError("file holds no rows")
    _check_sizes_before_reading(pf.metadata, limits)
    try:
        table = pf.read()
    except Exception as e:  # decoding errors inside the data pages
        raise RolloutFileError(f"corrupt parquet data: {type(e).__name__}: {e}") from None
    _check_lengths(table, limits)  # in Arrow's compact form, before any Python objects exist
    rows = table.to_pylist()
    _check_rows(rows, limits)
    return rows


def _list_budget(limits: Limits, rows: int) -> dict[str, int]:
    return {
        "prompt_tokens": rows * limits.max_prompt_tokens,
        "completion_tokens": rows * limits.max_completion_tokens,
        "completion_logprobs": rows * limits.max_completion_tokens,
    }


def _check_sizes_before_reading(metadata, limits: Limits) -> None:
    """A few kilobytes of parquet can decode to gigabytes (a long run of one value):
    the footer's value counts and sizes are checked before any page is decoded."""
    budget = _list_budget(limits, metadata.num_rows)
    values: dict[str, int] = {}
    decoded = 0
    for g in range(metadata.num_row_groups):
        rg = metadata.row_group(g)
        for j in range(rg.num_columns):
            col = rg.column(j)
            name = col.path_in_schema.split(".")[0]
            values[name] = values.get(name, 0) + col.num_values
            decoded += col.total_uncompressed_size
    for name, limit in budget.items():
        if values.get(name, 0) > limit:
            raise RolloutFileError(f"column '{name}' holds {values[name]} values, over {limit}")
    if decoded > MAX_DECODED_BYTES:
        raise RolloutFileError(f"file decodes to {decoded} bytes, over {MAX_DECODED_BYTES}")


def _check_lengths(table: pa.Table, limits: Limits) -> None:
    """The same limits on the decoded columns (a footer can lie)."""
    import pyarrow.compute as pc

    for name, limit in _list_budget(limits, 1).items():
        lengths = pc.list_value_length(table.column(name))
        longest = pc.max(lengths).as_py() or 0
        if longest > limit:
            raise RolloutFileError(f"column '{name}' has a list of {longest}, over {limit}")
    for name in ("problem_id", "node", "task_type", "prompt", "completion", "proofs"):
        longest = pc.max(pc.binary_length(table.column(name))).as_py() or 0
        if longest > MAX_FIELD_BYTES:
            raise RolloutFileError(f"column '{name}' has a value of {longest} bytes")


def _check_rows(rows: list[dict], limits: Limits) -> None:
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        for name in COLUMNS:
            if r[name] is None:
                raise RolloutFileError(f"row {i}: column '{name}' is null")
        if len(r["prompt_tokens"]) == 0 or len(r["prompt_tokens"]) > limits.max_prompt_tokens:
            raise RolloutFileError(f"row {i}: prompt length {len(r['prompt_tokens'])} out of range")
        n = len(r["completion_tokens"])
        if n == 0 or n > limits.max_completion_tokens:
            raise RolloutFileError(f"row {i}: completion length {n} out of range")
        if len(r["completion_logprobs"]) != n:
            raise RolloutFileError(
                f"row {i}: {len(r['completion_logprobs'])} logprobs for {n} tokens"
            )
        for name in ("reward", "task_reward", "length_penalty", "temperature"):
            if not math.isfinite(r[name]):
                raise RolloutFileError(f"row {i}: {name} is not finite")
        if not all(math.isfinite(x) and x <= 0.0 for x in r["completion_logprobs"]):
            raise RolloutFileError(f"row {i}: log-probs must be finite and <= 0")
        if r["policy_step"] < 0 or r["policy_step"] > r["step"]:
            raise RolloutFileError(
                f"row {i}: policy_step {r['policy_step']} not in [0, step {r['step']}]"
            )
        groups.setdefault(r["group"], []).append(i)
    steps = {r["step"] for r in rows}
    if len(steps) != 1:
        raise RolloutFileError(f"rows are for several steps {sorted(steps)}")
    for g, idx in groups.items():
        first = rows[idx[0]]
        if any(
            rows[i]["problem_id"] != first["problem_id"]
            or rows[i]["prompt_tokens"] != first["prompt_tokens"]
            for i in idx
        ):
            raise RolloutFileError(f"group {g} mixes prompts")
        if limits.group_size is not None and len(idx) != limits.group_size:
            raise RolloutFileError(f"group {g} has {len(idx)} rows, expected {limits.group_size}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
