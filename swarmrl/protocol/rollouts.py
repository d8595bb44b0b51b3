"""Rollout files: one parquet file per upload, one row per completion, whole groups.

Version 3 (written today) carries trajectories: `completion_tokens` holds every
span after the prompt in order (model, environment, model, ...), and
`completion_mask` says which tokens the model sampled (1) and which the
environment inserted (0: a tool's result, a user turn); the log-prob of an
environment token is 0. Each row records the temperature and the nucleus
(`top_p`) it was sampled at. The version is in the parquet metadata
(`swarmrl.rollouts`). Older files read into the same rows, so the readers have
one code path: a version-1 file (no such key, no mask column) as one model span
(a mask of ones), a version-1 or -2 file (no `top_p`) as top_p 1.0, which a run
with a nucleus then refuses.

The schema (docs/reference/formats.md) is checked exactly on read: a file with
a missing, extra or mistyped column, a list longer than the configured limits,
a group that is not whole, or a non-finite number is rejected with a reason
(`RolloutFileError`). Reading never trusts the file: parquet decoding errors,
invalid UTF-8 and nulls (in a column or inside a list) are turned into the same
error, so a hostile file cannot crash the reader.

What a file may cost to read is bounded before it is turned into Python objects.
A few kilobytes of parquet can decode to gigabytes: one long value in a
dictionary used by every row, a run of one repeated value, lists of millions of
elements stored as one run, or a footer that understates all of these. So:

- `decoded_budget(limits)` is the most an honest file within the run's limits
  decodes to (Arrow's buffers): per row, the token lists at their limits, text at
  `TEXT_BYTES_PER_TOKEN` and proofs at `PROOF_BYTES_PER_TOKEN` per token, and
  `ROW_BYTES` for the rest. A reader may lower it (`max_decoded`).
- The file is decoded in a child process whose address space is capped at
  `decode_memory(budget)` (swarmrl/capped.py): whatever its headers claim, an
  allocation past the cap fails and the file is not read. In the child the footer's
  value counts and sizes are checked first, then the text columns are read as
  dictionaries (a value repeated in every row is held once) and what they expand
  to is counted before any is expanded, and the whole must fit the budget. Sizes
  the file declares past the budget are its fault (`RolloutFileError`); a cap,
  deadline or crash reached without such a declaration proves nothing about the
  file (`RolloutUnreadable`: no one is blamed, and it counts against the sender's
  standing, orchestrator/judgement.py).
- Only then are the columns sent back (Arrow IPC) and turned into rows, which
  in Python take up to about 10 times their decoded size (an int is 28 bytes).
"""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from swarmrl import capped

SCHEMA_V1 = pa.schema(
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
VERSION = 3
VERSION_KEY = b"swarmrl.rollouts"  # parquet key-value metadata: the file's version
_MASK = pa.field("completion_mask", pa.list_(pa.int8()))
SCHEMA_V2 = SCHEMA_V1.insert(SCHEMA_V1.get_field_index("completion_logprobs") + 1, _MASK)
_TOP_P = pa.field("top_p", pa.float32())
SCHEMA = SCHEMA_V2.insert(SCHEMA_V2.get_field_index("temperature") + 1, _TOP_P)
SCHEMAS = {1: SCHEMA_V1, 2: SCHEMA_V2, 3: SCHEMA}
COLUMNS = SCHEMA.names
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_DECODED_BYTES = 1024 * 1024 * 1024  # all columns, decoded: the budget's ceiling
MAX_FIELD_BYTES = 16 * 1024 * 1024  # one string or binary value
TEXT_BYTES_PER_TOKEN = 64  # the budget's allowance for prompt and completion text
PROOF_BYTES_PER_TOKEN = 32  # ...for proofs (TOPLOC: 258 bytes per 32 tokens)
ROW_BYTES = 4096  # ...for the short strings, the numbers and the offsets of a row
DECODE_SLACK = 64 * 1024 * 1024  # the decoding child's memory beyond four times the budget
DECODE_TIMEOUT_S = 120.0
DECODE_TARGET = "swarmrl.protocol.rollouts:decode_in_child"  # what the capped child runs
TEXT_COLUMNS = ("problem_id", "node", "task_type", "prompt", "completion", "proofs")
LIST_COLUMNS = ("prompt_tokens", "completion_tokens", "completion_logprobs", "completion_mask")


class RolloutFileError(ValueError):
    """A rollout file that must not be trained on; the message says why, from what the
    file holds: its sender is to blame."""


class RolloutUnreadable(RuntimeError):
    """The reader could not decide on the file (its decoder died, ran past its
    deadline or over its memory cap, or failed in our own code): no one is to blame,
    and the file is not used now (the validator calls it `unverifiable`, the trainer
    tries it once more later)."""


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 32768  # model and environment tokens together
    max_rows: int = 65536
    group_size: int | None = None  # when set, every group must have exactly this many rows
    max_turns: int = 1 << 20  # model spans per trajectory

    @classmethod
    def of_run(cls, cfg) -> Limits:
        """The limits of a run's files (a RunConfig): its prompt and completion lengths,
        `worker.groups_per_file` whole groups of `worker.group_size`, its turn limit."""
        return cls(
            max_prompt_tokens=cfg.sampling.max_prompt_tokens,
            max_completion_tokens=cfg.sampling.max_new_tokens,
            max_rows=cfg.worker.groups_per_file * cfg.worker.group_size,
            group_size=cfg.worker.group_size,
            max_turns=cfg.env.turn_limit,
        )


def decoded_budget(limits: Limits) -> int:
    """The most an honest file within `limits` decodes to, in bytes of Arrow buffers
    (at most MAX_DECODED_BYTES)."""
    p, c = limits.max_prompt_tokens, limits.max_completion_tokens
    per_row = (
        4 * p  # prompt_tokens
        + 9 * c  # completion_tokens, completion_logprobs, completion_mask
        + TEXT_BYTES_PER_TOKEN * (p + c)
        + PROOF_BYTES_PER_TOKEN * c
        + ROW_BYTES
    )
    return min(MAX_DECODED_BYTES, limits.max_rows * per_row)


def decode_memory(max_decoded: int) -> int:
    """The address space the decoding child may add for a file of at most `max_decoded`
    decoded bytes: the columns as read, their text expanded, the Arrow IPC answer and
    builders' growth (a file near its budget peaks at about three times its decoded
    size), and DECODE_SLACK for pages and buffers."""
    return 4 * max_decoded + DECODE_SLACK


def write_rollouts(rows: list[dict]) -> bytes:
    """A version-3 file; a row without `completion_mask` is one model span. Every row
    says the nucleus it was sampled from (`top_p`), as it says its temperature."""
    rows = [
        r if "completion_mask" in r else r | {"completion_mask": [1] * len(r["completion_tokens"])}
        for r in rows
    ]
    schema = SCHEMA.with_metadata({VERSION_KEY: str(VERSION).encode()})
    table = pa.Table.from_pylist(rows, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def spans(mask: list[int]) -> list[tuple[int, int, bool]]:
    """The runs of a completion mask: (start, end, is the model's), in order."""
    out: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start] == 1))
            start = i
    return out


def file_version(schema: pa.Schema) -> int:
    """The version a file says it is: its metadata key, or 1 without one."""
    meta = schema.metadata or {}
    if VERSION_KEY not in meta:
        return 1
    raw = meta[VERSION_KEY]
    if raw not in (b"1", b"2", b"3"):
        raise RolloutFileError(f"rollout file version {raw[:20]!r} is not one this reader knows")
    return int(raw)


def read_rollouts(
    data: bytes,
    limits: Limits = Limits(),
    max_decoded: int | None = None,
    timeout_s: float = DECODE_TIMEOUT_S,
) -> list[dict]:
    """Parse and validate a rollout file; return its rows. It is decoded within
    `decoded_budget(limits)` bytes, or `max_decoded` if that is lower, in the capped
    child (`decode_memory` of the budget: the module's docstring), by `timeout_s`.
    RolloutFileError: the file is at fault; RolloutUnreadable: no decision."""
    if len(data) > MAX_FILE_BYTES:
        raise RolloutFileError(f"file is {len(data)} bytes, over the {MAX_FILE_BYTES} limit")
    budget = decoded_budget(limits)
    if max_decoded is not None:
        budget = min(budget, max_decoded)
    params = {"limits": asdict(limits), "max_decoded": budget}
    try:
        answer = capped.shared().call(DECODE_TARGET, data, params, decode_memory(budget), timeout_s)
    except capped.CappedRefusal as e:
        raise RolloutFileError(str(e)) from None
    except capped.CappedFailure as e:
        raise RolloutUnreadable(str(e)) from None
    try:
        table = pa.ipc.open_stream(pa.py_buffer(answer)).read_all()
        rows = table.to_pylist()
    except Exception as e:  # the child checked the columns; a failure here is still the file's
        raise RolloutFileError(f"unreadable columns: {type(e).__name__}: {e}") from None
    version = file_version(table.schema)
    for r in rows:
        if version == 1:
            r["completion_mask"] = [1] * len(r["completion_tokens"])
        if version < 3:  # before the column: read as the whole distribution, so that a
            r["top_p"] = 1.0  # run with a nucleus (top_p < 1) refuses such a file
    _check_rows(rows, limits)
    return rows


def decode_in_child(data: bytes, params: dict) -> pa.Buffer:
    """The capped child's part of `read_rollouts`: the checked columns as an Arrow IPC
    stream."""
    table = decode_table(data, Limits(**params["limits"]), params["max_decoded"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_table(data: bytes, limits: Limits, max_decoded: int) -> pa.Table:
    """The file's columns, checked against `limits` and `max_decoded` in Arrow's form
    before any Python object exists. Run it in the capped child (`read_rollouts`):
    only there does the kernel bound what a lying file makes it allocate."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        schema = pf.schema_arrow
    except MemoryError:
        raise
    except Exception as e:  # any decoding failure means a corrupt file
        raise RolloutFileError(f"not a readable parquet file: {type(e).__name__}: {e}") from None
    version = file_version(schema)
    expected = SCHEMAS[version]
    missing = [c for c in expected.names if c not in schema.names]
    extra = [c for c in schema.names if c not in expected.names]
    if missing or extra:
        raise RolloutFileError(
            f"schema mismatch (version {version}): missing columns {missing}, unexpected {extra}"
        )
    for field in expected:
        got = schema.field(field.name).type
        if got != field.type:
            raise RolloutFileError(f"column '{field.name}' has type {got}, expected {field.type}")
    if pf.metadata.num_rows > limits.max_rows:
        raise RolloutFileError(f"{pf.metadata.num_rows} rows, over the limit of {limits.max_rows}")
    if pf.metadata.num_rows == 0:
        raise RolloutFileError("file holds no rows")
    _check_sizes_before_reading(pf.metadata, limits, max_decoded)
    try:  # text as dictionaries: a value repeated in every row is held once
        table = pq.ParquetFile(pa.BufferReader(data), read_dictionary=TEXT_COLUMNS).read(
            use_threads=False
        )
    except MemoryError:
        raise
    except Exception as e:  # decoding errors inside the data pages
        raise RolloutFileError(f"corrupt parquet data: {type(e).__name__}: {e}") from None
    if table.num_rows != pf.metadata.num_rows:
        raise RolloutFileError(
            f"the pages hold {table.num_rows} rows, the footer says {pf.metadata.num_rows}"
        )
    _check_lengths(table, limits)
    _check_decoded(table, max_decoded)
    columns = [_expanded(table.column(f.name)) for f in expected]
    table = pa.Table.from_arrays(columns, schema=expected.with_metadata(schema.metadata))
    _check_values(table)
    return table


def _check_values(table: pa.Table) -> None:
    """What Arrow holds must turn into the rows the readers expect: valid UTF-8 in the
    text columns, and no null anywhere (a row's value, or an element of its lists)."""
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as e:
        raise RolloutFileError(f"invalid column data: {e}") from None
    for name in table.column_names:
        column = table.column(name)
        if column.null_count:
            raise RolloutFileError(f"column '{name}' holds a null")
        if pa.types.is_list(column.type) and pc.list_flatten(column).null_count:
            raise RolloutFileError(f"column '{name}' holds a list with a null in it")


def _list_budget(limits: Limits, rows: int) -> dict[str, int]:
    return {
        "prompt_tokens": rows * limits.max_prompt_tokens,
        "completion_tokens": rows * limits.max_completion_tokens,
        "completion_logprobs": rows * limits.max_completion_tokens,
        "completion_mask": rows * limits.max_completion_tokens,
    }


def _check_sizes_before_reading(metadata, limits: Limits, max_decoded: int) -> None:
    """The footer's value counts and sizes, checked before any page is decoded: this
    names the problem when the footer is honest (when it lies, the counts after
    decoding and the child's memory cap refuse the file)."""
    budget = _list_budget(limits, metadata.num_rows)
    values: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for g in range(metadata.num_row_groups):
        rg = metadata.row_group(g)
        for j in range(rg.num_columns):
            col = rg.column(j)
            name = col.path_in_schema.split(".")[0]
            values[name] = values.get(name, 0) + col.num_values
            sizes[name] = sizes.get(name, 0) + col.total_uncompressed_size
    for name, limit in budget.items():
        if values.get(name, 0) > limit:
            raise RolloutFileError(f"column '{name}' holds {values[name]} values, over {limit}")
    _refuse_over(sizes, max_decoded, "file's pages hold {} bytes uncompressed", "")


def _value_lengths(column: pa.ChunkedArray) -> pa.Array:
    """The byte length of each value of a text column, dictionary-encoded or not,
    without expanding it."""
    parts = []
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):
            parts.append(pc.binary_length(chunk.dictionary).take(chunk.indices))
        else:
            parts.append(pc.binary_length(chunk))
    return pa.concat_arrays(parts) if parts else pa.array([], pa.int32())


def _check_lengths(table: pa.Table, limits: Limits) -> None:
    """The list limits per row, and MAX_FIELD_BYTES per text value."""
    for name, limit in _list_budget(limits, 1).items():
        if name not in table.column_names:  # the mask of a version-1 file
            continue
        lengths = pc.list_value_length(table.column(name))
        longest = pc.max(lengths).as_py() or 0
        if longest > limit:
            raise RolloutFileError(f"column '{name}' has a list of {longest}, over {limit}")
    for name in TEXT_COLUMNS:
        longest = pc.max(_value_lengths(table.column(name))).as_py() or 0
        if longest > MAX_FIELD_BYTES:
            raise RolloutFileError(f"column '{name}' has a value of {longest} bytes")


def _check_decoded(table: pa.Table, max_decoded: int) -> None:
    """What the columns take once every text value is expanded, counted before any is."""
    sizes = {}
    for name in table.column_names:
        column = table.column(name)
        if name in TEXT_COLUMNS:
            text = pc.sum(_value_lengths(column)).as_py() or 0
            sizes[name] = text + 4 * (len(column) + column.num_chunks) + len(column) // 8 + 1
        else:
            sizes[name] = column.nbytes
    _refuse_over(sizes, max_decoded, "file decodes to {} bytes", f" bytes in {table.num_rows} rows")


def _refuse_over(sizes: dict[str, int], limit: int, what: str, unit: str) -> None:
    """RolloutFileError if the columns' `sizes` add up past `limit`, naming the widest."""
    total = sum(sizes.values())
    if total > limit:
        widest = max(sizes, key=sizes.get)
        raise RolloutFileError(
            f"{what.format(total)} (column '{widest}': {sizes[widest]}{unit}), over its "
            f"limit of {limit}"
        )


def _expanded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if not pa.types.is_dictionary(column.type):
        return column
    return pa.chunked_array([c.dictionary_decode() for c in column.chunks], column.type.value_type)


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
        _check_mask(i, r, limits)
        for name in ("reward", "task_reward", "length_penalty", "temperature", "top_p"):
            if not math.isfinite(r[name]):
                raise RolloutFileError(f"row {i}: {name} is not finite")
        if not 0.0 < r["top_p"] <= 1.0:
            raise RolloutFileError(f"row {i}: top_p {r['top_p']} is not in (0, 1]")
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


def _check_mask(i: int, r: dict, limits: Limits) -> None:
    """One mask entry per token, each 0 or 1; the trajectory starts and ends with the
    model (an environment span sits between two model spans); environment tokens have
    log-prob 0; at most `max_turns` model spans."""
    mask = r["completion_mask"]
    if len(mask) != len(r["completion_tokens"]):
        raise RolloutFileError(
            f"row {i}: completion_mask has {len(mask)} entries for "
            f"{len(r['completion_tokens'])} tokens"
        )
    if any(m not in (0, 1) for m in mask):
        raise RolloutFileError(f"row {i}: completion_mask holds values other than 0 and 1")
    if mask[0] != 1 or mask[-1] != 1:
        raise RolloutFileError(
            f"row {i}: the completion must start and end with the model's tokens "
            "(an environment span sits between two model spans)"
        )
    if any(lp != 0.0 for lp, m in zip(r["completion_logprobs"], mask, strict=True) if not m):
        raise RolloutFileError(f"row {i}: an environment token has a log-prob other than 0")
    turns = sum(1 for _, _, model in spans(mask) if model)
    if turns > limits.max_turns:
        raise RolloutFileError(
            f"row {i}: {turns} model turns, over the limit of {limits.max_turns}"
        )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
