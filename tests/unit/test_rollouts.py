import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.protocol.rollouts import (
    SCHEMA,
    SCHEMA_V1,
    SCHEMA_V2,
    VERSION_KEY,
    Limits,
    RolloutFileError,
    read_rollouts,
    spans,
    write_rollouts,
)


def make_rows(groups: int = 2, g: int = 3, step: int = 5, policy: int = 4) -> list[dict]:
    rows = []
    for gi in range(groups):
        for j in range(g):
            rows.append(
                {
                    "problem_id": f"p{gi}",
                    "group": gi,
                    "prompt_tokens": [1, 2, 3 + gi],
                    "completion_tokens": [4, 5 + j],
                    "completion_logprobs": [-0.5, -1.25],
                    "reward": 0.5 * j,
                    "task_reward": 0.5 * j,
                    "length_penalty": 0.0,
                    "target_length": 0,
                    "step": step,
                    "policy_step": policy,
                    "seed": 123,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "proofs": b"",
                    "node": "ab" * 16,
                    "task_type": "reverse_text",
                    "prompt": "abc",
                    "completion": "x",
                }
            )
    return rows


def _table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def test_round_trip_keeps_schema_and_values():
    rows = make_rows()
    data = write_rollouts(rows)
    assert pq.read_schema(io.BytesIO(data)).equals(SCHEMA, check_metadata=False)
    back = read_rollouts(data, Limits(group_size=3))
    # a row written without a mask is one model span
    assert back == [r | {"completion_mask": [1, 1]} for r in rows]


@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda d: d[: len(d) // 2], "not a readable parquet"),
        (lambda d: b"garbage" * 10, "not a readable parquet"),
    ],
)
def test_corrupt_bytes_are_rejected(mutate, reason):
    with pytest.raises(RolloutFileError, match=reason):
        read_rollouts(mutate(write_rollouts(make_rows())))


def test_schema_violations_are_named():
    table = pa.Table.from_pylist(make_rows(), schema=SCHEMA_V1)  # a version-1 file
    with pytest.raises(RolloutFileError, match=r"missing columns \['reward'\]"):
        read_rollouts(_table_bytes(table.drop_columns(["reward"])))
    wrong = table.set_column(
        table.schema.get_field_index("step"), "step", pa.array([5] * 6, pa.int64())
    )
    with pytest.raises(RolloutFileError, match="column 'step' has type int64"):
        read_rollouts(_table_bytes(wrong))
    with pytest.raises(RolloutFileError, match="unexpected \\['extra'\\]"):
        read_rollouts(_table_bytes(table.append_column("extra", pa.array([1] * 6))))


def test_limits_and_consistency():
    rows = make_rows()
    rows[0]["completion_tokens"] = list(range(50))
    rows[0]["completion_logprobs"] = [-1.0] * 50
    with pytest.raises(RolloutFileError, match="'completion_tokens' has a list of 50, over 16"):
        read_rollouts(write_rollouts(rows), Limits(max_completion_tokens=16))
    rows = make_rows()
    rows[1]["completion_logprobs"] = [-1.0]
    with pytest.raises(RolloutFileError, match="1 logprobs for 2 tokens"):
        read_rollouts(write_rollouts(rows))
    rows = make_rows()[:-1]
    with pytest.raises(RolloutFileError, match="group 1 has 2 rows, expected 3"):
        read_rollouts(write_rollouts(rows), Limits(group_size=3))
    rows = make_rows()
    rows[2]["reward"] = float("nan")
    with pytest.raises(RolloutFileError, match="reward is not finite"):
        read_rollouts(write_rollouts(rows))
    rows = make_rows(step=3, policy=4)
    with pytest.raises(RolloutFileError, match="policy_step 4 not in"):
        read_rollouts(write_rollouts(rows))
    rows = make_rows()
    rows[4]["prompt_tokens"] = [9, 9]
    with pytest.raises(RolloutFileError, match="group 1 mixes prompts"):
        read_rollouts(write_rollouts(rows))


def test_a_compressed_bomb_is_refused_before_it_is_decoded():
    """A few kilobytes of zstd can hold millions of list values; the footer's counts
    are checked before any page is decoded into Python lists."""
    import numpy as np

    rows = make_rows(groups=1, g=1)
    n = 2_000_000
    cols = {f.name: pa.array([rows[0][f.name]], type=f.type) for f in SCHEMA_V1}
    offsets = pa.array([0, n], pa.int32())
    cols["completion_tokens"] = pa.ListArray.from_arrays(offsets, pa.array(np.zeros(n, "int32")))
    cols["completion_logprobs"] = pa.ListArray.from_arrays(
        offsets, pa.array(np.zeros(n, "float32"))
    )
    buf = io.BytesIO()
    table = pa.table([cols[f.name] for f in SCHEMA_V1], schema=SCHEMA_V1)
    pq.write_table(table, buf, compression="zstd")
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(RolloutFileError, match="completion_tokens' holds 2000000 values"):
        read_rollouts(buf.getvalue(), Limits(max_completion_tokens=40, max_rows=12))


def _trajectory_rows() -> list[dict]:
    """One group of two: a model span, a tool's answer, the model again; and a single span."""
    rows = make_rows(groups=1, g=2)
    rows[0].update(
        completion_tokens=[4, 5, 6, 7, 8, 9],
        completion_logprobs=[-0.5, -1.0, 0.0, 0.0, -0.25, -0.125],
        completion_mask=[1, 1, 0, 0, 1, 1],
    )
    return rows


def test_a_trajectory_round_trips_and_a_version_1_file_reads_as_one_model_span():
    rows = _trajectory_rows()
    data = write_rollouts(rows)
    schema = pq.read_schema(io.BytesIO(data))
    assert schema.metadata[VERSION_KEY] == b"3" and "completion_mask" in schema.names
    back = read_rollouts(data, Limits(group_size=2, max_turns=2))
    assert back[0] == rows[0] and back[1]["completion_mask"] == [1, 1]
    assert spans(back[0]["completion_mask"]) == [(0, 2, True), (2, 4, False), (4, 6, True)]
    assert spans([1]) == [(0, 1, True)]
    # a file of today's format before the mask: no version key, no mask column
    old = pa.Table.from_pylist(make_rows(), schema=SCHEMA_V1)
    back = read_rollouts(_table_bytes(old), Limits(group_size=3))
    assert [r["completion_mask"] for r in back] == [[1, 1]] * 6
    assert [r["completion_tokens"] for r in back] == [r["completion_tokens"] for r in make_rows()]


def test_a_bad_trajectory_is_refused_with_a_reason():
    cases = [
        ({"completion_mask": [1, 1, 0, 0, 1]}, "completion_mask has 5 entries for 6 tokens"),
        ({"completion_mask": [1, 1, 2, 0, 1, 1]}, "values other than 0 and 1"),
        ({"completion_mask": [0, 0, 1, 1, 1, 1],
          "completion_logprobs": [0.0, 0.0, -1.0, -1.0, -1.0, -1.0]}, "start and end"),
        ({"completion_mask": [1, 1, 1, 1, 0, 0],
          "completion_logprobs": [-1.0, -1.0, -1.0, -1.0, 0.0, 0.0]}, "start and end"),
        ({"completion_logprobs": [-0.5, -1.0, -0.1, 0.0, -0.25, -0.125]},
         "an environment token has a log-prob other than 0"),
    ]  # fmt: skip
    for change, reason in cases:
        rows = _trajectory_rows()
        rows[0].update(change)
        with pytest.raises(RolloutFileError, match=reason):
            read_rollouts(write_rollouts(rows))
    with pytest.raises(RolloutFileError, match="2 model turns, over the limit of 1"):
        read_rollouts(write_rollouts(_trajectory_rows()), Limits(max_turns=1))
    # the version key and the columns must agree, and an unknown version is named
    table = pa.Table.from_pylist(_trajectory_rows(), schema=SCHEMA)
    with pytest.raises(RolloutFileError, match=r"version 1\): missing columns \[\], unexp"):
        read_rollouts(_table_bytes(table))  # a mask without the version key
    v1 = pa.Table.from_pylist(make_rows(), schema=SCHEMA_V1.with_metadata({VERSION_KEY: b"2"}))
    with pytest.raises(RolloutFileError, match=r"missing columns \['completion_mask'\]"):
        read_rollouts(_table_bytes(v1))
    v4 = table.replace_schema_metadata({VERSION_KEY: b"4"})
    with pytest.raises(RolloutFileError, match="version b'4' is not one this reader knows"):
        read_rollouts(_table_bytes(v4))


def test_each_row_says_its_nucleus_and_a_file_before_the_column_reads_as_the_whole():
    """Version 3 records top_p per row, as temperature is; a version-2 file (no such
    column) reads as top_p 1.0, so that only a run without a nucleus takes it."""
    rows = [r | {"top_p": 0.9} for r in make_rows()]
    assert [r["top_p"] for r in read_rollouts(write_rollouts(rows))] == pytest.approx([0.9] * 6)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(RolloutFileError, match="top_p"):
            read_rollouts(write_rollouts([r | {"top_p": bad} for r in make_rows()]))
    v2_rows = [{k: v for k, v in r.items() if k != "top_p"} for r in _trajectory_rows()]
    for r in v2_rows:
        r.setdefault("completion_mask", [1] * len(r["completion_tokens"]))
    v2 = pa.Table.from_pylist(v2_rows, schema=SCHEMA_V2.with_metadata({VERSION_KEY: b"2"}))
    back = read_rollouts(_table_bytes(v2), Limits(group_size=2, max_turns=2))
    assert [r["top_p"] for r in back] == [1.0, 1.0]
    assert [r["completion_mask"] for r in back] == [r["completion_mask"] for r in v2_rows]
