import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.inference.rollouts import (
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
    rows[0]["completion_tokens"] = list(range(100))
    rows[0]["completion_logprobs"] = [-1.0] * 100
    with pytest.raises(RolloutFileError, match="completion length 100 out of range"):
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
