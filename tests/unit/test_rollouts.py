import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.protocol.rollouts import (
    SCHEMA,
    Limits,
    RolloutFileError,
    read_rollouts,
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
    assert back == rows


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
    table = pa.Table.from_pylist(make_rows(), schema=SCHEMA)
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
    cols = {f.name: pa.array([rows[0][f.name]], type=f.type) for f in SCHEMA}
    offsets = pa.array([0, n], pa.int32())
    cols["completion_tokens"] = pa.ListArray.from_arrays(offsets, pa.array(np.zeros(n, "int32")))
    cols["completion_logprobs"] = pa.ListArray.from_arrays(
        offsets, pa.array(np.zeros(n, "float32"))
    )
    buf = io.BytesIO()
    pq.write_table(pa.table([cols[f.name] for f in SCHEMA], schema=SCHEMA), buf, compression="zstd")
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(RolloutFileError, match="completion_tokens' holds 2000000 values"):
        read_rollouts(buf.getvalue(), Limits(max_completion_tokens=40, max_rows=12))
