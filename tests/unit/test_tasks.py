import json

import pytest

from swarmrl.config import TaskConfig
from swarmrl.tasks.dataset import TaskSource, load_task_file
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.schema import TaskError, parse_task

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
    bad.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "task_type": "chess"}) + "\n")
    with pytest.raises(TaskError, match="record 1: field 'task_type'"):
        load_task_file(bad)


def test_length_penalties():
    assert length_penalty("none", 50, 10, 0.1) == 0.0
    assert length_penalty("exact", 13, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("exact", 7, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("max", 7, 10, 0.1) == 0.0
    assert length_penalty("max", 13, 10, 0.1) == pytest.approx(0.3)
    assert length_penalty("clip", 100, 10, 0.1) == 1.0
