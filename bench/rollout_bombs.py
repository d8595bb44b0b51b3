"""Rollout files that are small on disk and huge decoded, as a hostile worker would upload
them: shared by tests/unit/test_rollout_bombs.py and the hostile mix of
bench/orchestrator_load.py.

- `dictionary_bomb`: one long text value in every row, dictionary-encoded (the
  footer counts the value once, the rows decode it once each);
- `repeated_bomb`: the same, written without a dictionary (plain pages, which
  zstd shrinks to almost nothing);
- `nested_bomb`: rows whose token lists hold millions of one repeated id (a run of
  one dictionary index: a few bytes a row);
- `understated(data)`: the same bytes with a footer that lies, stating tiny value
  counts and sizes for every column, so that only decoding finds the truth.

The footer is parquet's FileMetaData in Thrift's compact protocol; `understated`
reads it into a tree of fields, changes the counts and sizes, and writes it back
(`_Compact`: just enough of the protocol for that).

Run as a program, it is the validator's side of the hostile mix
(bench/orchestrator_hostile.py): it reads each bomb as a validator of the default
run does (`read_rollouts` with `Limits.of_run`, as validator/checks.py) and prints
one JSON object: each bomb's size, the reason it was refused, the decoding child's
peak against its cap, and how much this reader's own peak memory grew.
"""

from __future__ import annotations

import io
import struct

import pyarrow as pa
import pyarrow.parquet as pq

from swarmrl.protocol.rollouts import SCHEMA, VERSION, VERSION_KEY

_SCHEMA = SCHEMA.with_metadata({VERSION_KEY: str(VERSION).encode()})


def honest_row(group: int = 0, tokens: int = 2) -> dict:
    return {
        "problem_id": f"p{group}", "group": group, "prompt_tokens": [1, 2, 3],
        "completion_tokens": [4] * tokens, "completion_logprobs": [-0.5] * tokens,
        "completion_mask": [1] * tokens, "reward": 0.0, "task_reward": 0.0,
        "length_penalty": 0.0, "target_length": 0, "step": 5, "policy_step": 4, "seed": 1,
        "temperature": 1.0, "top_p": 1.0, "proofs": b"", "node": "ab" * 16, "task_type": "reverse_text",
        "prompt": "abc", "completion": "x",
    }  # fmt: skip


def _write(table: pa.Table, copies: int = 1, **options) -> bytes:
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, _SCHEMA, compression="zstd", **options) as w:
        for _ in range(copies):
            w.write_table(table)
    return buf.getvalue()


def dictionary_bomb(rows: int = 384, value_bytes: int = 1 << 20) -> bytes:
    """`rows` rows whose completion is one value of `value_bytes`, in a dictionary."""
    table = pa.Table.from_pylist(
        [honest_row() | {"completion": "x" * value_bytes} for _ in range(rows)], schema=_SCHEMA
    )
    return _write(table)


def repeated_bomb(rows: int = 64, value_bytes: int = 1 << 20) -> bytes:
    """The same long value in every row, in plain pages (no dictionary)."""
    table = pa.Table.from_pylist(
        [honest_row() | {"completion": "x" * value_bytes} for _ in range(rows)], schema=_SCHEMA
    )
    return _write(table, use_dictionary=False)


def nested_bomb(rows: int = 64, elements: int = 1 << 22) -> bytes:
    """`rows` rows, each with `elements` tokens, log-probs and mask entries of one value."""
    one = pa.Table.from_pylist([honest_row(tokens=elements)], schema=_SCHEMA)
    return _write(one, copies=rows)


def bomb_set(rows: int) -> dict[str, bytes]:
    """Every kind of bomb with `rows` rows (a run's rows per file), each also with an
    understated footer."""
    made = {
        "dictionary": dictionary_bomb(rows, 1 << 20),
        "repeated": repeated_bomb(rows, 1 << 20),
        "nested": nested_bomb(rows, 1 << 21),
    }
    return made | {f"{name}/understated": understated(d) for name, d in made.items()}


def understated(data: bytes, values: int = 1, size: int = 64) -> bytes:
    """`data` with a footer claiming `values` values and `size` bytes for every column
    chunk (and `size` bytes for every row group), the pages untouched."""
    if data[-4:] != b"PAR1":
        raise ValueError("not a parquet file")
    n = struct.unpack("<I", data[-8:-4])[0]
    footer = _Compact(data[-8 - n : -8]).struct()
    for group in _field(footer, 4):  # row_groups
        _set(group, 2, size)  # total_byte_size
        for chunk in _field(group, 1):  # columns
            meta = _field(chunk, 3)  # meta_data
            _set(meta, 5, values)  # num_values
            _set(meta, 6, size)  # total_uncompressed_size
    out = _Writer()
    out.struct(footer)
    body = bytes(out.buf)
    return data[: -8 - n] + body + struct.pack("<I", len(body)) + b"PAR1"


# Thrift's compact protocol, as parquet's footer uses it: a struct is a list of
# [field id, type, value]; lists are [element type, [values]].
_STOP, _TRUE, _FALSE, _I8, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(
    13
)


def _field(fields: list, fid: int):
    for f in fields:
        if f[0] == fid:
            return f[2][1] if f[1] in (_LIST, _SET) else f[2]
    raise KeyError(fid)


def _set(fields: list, fid: int, value: int) -> None:
    for f in fields:
        if f[0] == fid:
            f[2] = value
            return
    raise KeyError(fid)


class _Compact:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, kind: int):
        if kind in (_TRUE, _FALSE):
            return kind == _TRUE
        if kind == _I8:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            self.pos += 8
            return self.data[self.pos - 8 : self.pos]
        if kind == _BINARY:
            n = self.varint()
            self.pos += n
            return self.data[self.pos - n : self.pos]
        if kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if elem in (_TRUE, _FALSE):
                return [elem, [self.byte() == 1 for _ in range(size)]]
            return [elem, [self.value(elem) for _ in range(size)]]
        if kind == _STRUCT:
            return self.struct()
        raise ValueError(f"compact type {kind} is not used by parquet's footer")

    def struct(self) -> list:
        fields, last = [], 0
        while True:
            head = self.byte()
            if head == _STOP:
                return fields
            delta, kind = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            fields.append([fid, kind, self.value(kind)])
            last = fid


class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def varint(self, v: int) -> None:
        while True:
            if v < 0x80:
                self.buf.append(v)
                return
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7

    def zigzag(self, v: int) -> None:
        self.varint((v << 1) ^ (v >> 63))

    def value(self, kind: int, v) -> None:
        if kind in (_TRUE, _FALSE):
            return  # a struct's bool lives in its field header
        if kind == _I8:
            self.buf.append(v)
        elif kind in (_I16, _I32, _I64):
            self.zigzag(v)
        elif kind == _DOUBLE:
            self.buf += v
        elif kind == _BINARY:
            self.varint(len(v))
            self.buf += v
        elif kind in (_LIST, _SET):
            elem, items = v
            if len(items) < 15:
                self.buf.append(len(items) << 4 | elem)
            else:
                self.buf.append(0xF0 | elem)
                self.varint(len(items))
            for item in items:
                if elem in (_TRUE, _FALSE):
                    self.buf.append(1 if item else 2)
                else:
                    self.value(elem, item)
        elif kind == _STRUCT:
            self.struct(v)

    def struct(self, fields: list) -> None:
        last = 0
        for fid, kind, v in fields:
            if kind in (_TRUE, _FALSE):
                kind = _TRUE if v else _FALSE
            if 0 < fid - last <= 15:
                self.buf.append((fid - last) << 4 | kind)
            else:
                self.buf.append(kind)
                self.zigzag(fid)
            self.value(kind, v)
            last = fid
        self.buf.append(_STOP)


def main() -> None:
    import json
    import resource
    import time

    from swarmrl import capped
    from swarmrl.config import load_config
    from swarmrl.protocol.rollouts import (
        Limits,
        RolloutFileError,
        decode_memory,
        decoded_budget,
        read_rollouts,
    )

    limits = Limits.of_run(load_config(None, []))
    budget = decoded_budget(limits)
    files = bomb_set(limits.max_rows)
    honest = [honest_row() for _ in range(limits.group_size or 1)]
    read_rollouts(_write(pa.Table.from_pylist(honest, schema=_SCHEMA)), limits)  # warm
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {}
    for name, data in files.items():
        t0 = time.monotonic()
        try:
            read_rollouts(data, limits)
            reason = None
        except RolloutFileError as e:
            reason = str(e)
        out[name] = {
            "file_kb": round(len(data) / 1024, 1),
            "refused": reason,
            "child_peak_mb": round(capped.shared().last_peak_bytes / 2**20, 1),
            "seconds": round(time.monotonic() - t0, 2),
        }
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
    print(json.dumps({
        "rows": limits.max_rows,
        "budget_mb": round(budget / 2**20, 2),
        "cap_mb": round(decode_memory(budget) / 2**20, 1),
        "bombs": out,
        "all_refused": all(b["refused"] for b in out.values()),
        "child_peak_max_mb": max(b["child_peak_mb"] for b in out.values()),
        "reader_peak_growth_mb": round(grew / 1024, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
