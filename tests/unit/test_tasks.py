import json

import pytest

from swarmrl.config import TaskConfig
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.schema import TaskError, parse_task
from swarmrl.tasks.sources.task_source import TaskSource, load_task_file

GOOD = {
    "problem_id": "p1",
    "prompt": "What is 1 + 2?",
    "task_type": "addition",
    "verification_info": {"answer": "3"},
    "metadata": {},
}


def test_task_record_validation_names_the_field():
    assert parse_task(GOOD).verification_info == {"answer": "3"}
    assert (
        parse_task({**GOOD, "verification_info": '{"answer": "3"}'}).verification_info["answer"]
        == "3"
    )
    with pytest.raises(TaskError, match="row 4: field 'prompt'"):
        parse_task({**GOOD, "prompt": ""}, where="row 4")
    with pytest.raises(TaskError, match="field 'verification_info'"):
        parse_task({**GOOD, "verification_info": "{not json"})
    with pytest.raises(TaskError, match="field 'colour': unknown field"):
        parse_task({**GOOD, "colour": "red"})
    with pytest.raises(TaskError, match="field 'problem_id'"):
        parse_task({k: v for k, v in GOOD.items() if k != "problem_id"})


def test_task_file_jsonl(tmp_path):
    f = tmp_path / "tasks.jsonl"
    f.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "problem_id": "p2"}) + "\n")
    src = TaskSource(TaskConfig(dataset=str(f)), seed=0)
    assert src.get("train", 3).problem_id == "p2"  # wraps modulo size
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, "task_type": "chess"}) + "\n")
    with pytest.raises(TaskError, match="bad.jsonl line 3: field 'task_type'"):
        load_task_file(bad)
    bad.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "prompt": 7})[:-3] + "\n")
    with pytest.raises(TaskError, match="bad.jsonl line 2: not valid JSON"):
        load_task_file(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(TaskError, match="line 1: a record must be a JSON object"):
        load_task_file(bad)


def test_task_file_parquet_errors_name_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "tasks.parquet"
    rows = [GOOD, {**GOOD, "problem_id": "p2", "prompt": ""}]
    table = pa.Table.from_pylist(
        [{**r, "verification_info": json.dumps(r["verification_info"]), "metadata": "{}"}
         for r in rows]
    )  # fmt: skip
    pq.write_table(table, f)
    with pytest.raises(TaskError, match="tasks.parquet row 1: field 'prompt'"):
        load_task_file(f)
    f.write_bytes(b"PAR1 not really")
    with pytest.raises(TaskError, match="not a readable parquet file"):
        load_task_file(f)


def test_length_penalties():
    assert length_penalty("none", 50, 10, 0.1) == 0.0
    assert length_penalty("exact", 13, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("exact", 7, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("max", 7, 10, 0.1) == 0.0
    assert length_penalty("max", 13, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("clip", 100, 10, 0.1) == 1.0


def test_budgets_fit_the_nodes_length_budget():
    from swarmrl.protocol.prompts import budget_targets

    assert budget_targets([100, 200, 400], 250) == [100, 200]
    assert budget_targets([100, 200, 400], 1000) == [100, 200, 400]
    assert budget_targets([300, 200], 50) == [200]  # none fits: the smallest


def test_budget_report_on_hand_computed_lengths():
    from swarmrl.apps.evaluate import budget_report

    r = budget_report([90, 100, 130, 200], 100, 200, "exact", 0.01)
    assert r["mean_tokens"] == 130.0 and r["median_tokens"] == 130
    assert r["mean_abs_error"] == (10 + 0 + 30 + 100) / 4
    assert r["within_10pct"] == 0.5 and r["within_25pct"] == 0.5
    assert r["over_budget"] == 0.5 and r["hit_limit"] == 0.25
    assert r["mean_penalty"] == pytest.approx((0.1 + 0 + 0.3 + 1.0) / 4)
    assert budget_report([90, 130], 100, 200, "max", 0.01)["mean_penalty"] == pytest.approx(0.15)
    assert budget_report([300], 100, 400, "clip", 0.01)["mean_penalty"] == 1.0


def test_the_instruction_follows_every_prompt():
    from swarmrl.config import TaskConfig
    from swarmrl.tasks.sources.task_source import TaskSource

    plain = TaskSource(TaskConfig(name="addition"), 0).get("train", 4)
    told = TaskSource(TaskConfig(name="addition", instruction="Answer with the number only."), 0)
    t = told.get("train", 4)
    assert t.prompt == plain.prompt + "\nAnswer with the number only."
    assert t.verification_info == plain.verification_info
