"""The code verifier: extraction, stdin/stdout and assert-style tests, reward
modes, limits, task-file validation, and the example file."""

import importlib.util
import json
from pathlib import Path

import pytest

from swarmrl.tasks.graders.code import CodeSettings, extract_program, score_code
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import Task, TaskError
from swarmrl.tasks.sources.task_source import load_task_file

ROOT = Path(__file__).resolve().parents[2]
PAIRS = {"tests": [{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in [(1, 2), (5, 5), (-3, 9), (0, 0)]]}  # fmt: skip
ASSERTS = {"tests": [{"assert": "assert add(1, 2) == 3"}, {"assert": "assert add(1, 0) == 1"}]}
S = CodeSettings(isolation="process", parallel=2)


def fenced(code: str, lang: str = "python") -> str:
    return f"Here it is:\n```{lang}\n{code}\n```\nDone."


def test_extract_takes_the_last_python_block():
    text = "```python\nprint(1)\n```\ntext\n```\nprint(2)\n```\n```json\n{}\n```"
    assert extract_program(text).strip() == "print(2)"
    assert extract_program("print(3)") == "print(3)"


def test_stdio_fraction_and_all_or_nothing():
    right = fenced("a, b = map(int, input().split())\nprint(a + b)")
    wrong_on_negatives = fenced(
        "a, b = input().split()\nprint(int(a) + int(b) if '-' not in a else 0)"
    )
    assert score_code(right, PAIRS, S) == 1.0
    assert score_code(wrong_on_negatives, PAIRS, S) == 0.75
    all_mode = CodeSettings(isolation="process", reward="all")
    assert score_code(wrong_on_negatives, PAIRS, all_mode) == 0.0
    assert score_code(right, PAIRS, all_mode) == 1.0


def test_output_comparison_ignores_trailing_whitespace_only():
    info = {"tests": [{"input": "", "output": "1 2\n3\n"}]}
    assert score_code(fenced("print('1 2   ')\nprint(3)\nprint()"), info, S) == 1.0
    assert score_code(fenced("print('1  2')\nprint(3)"), info, S) == 0.0


def test_crash_after_correct_output_fails():
    info = {"tests": [{"input": "", "output": "7\n"}]}
    assert score_code(fenced("print(7)\nraise SystemExit(1)"), info, S) == 0.0


def test_assert_tests_and_early_exit_cheats():
    assert score_code(fenced("def add(a, b):\n    return a + b"), ASSERTS, S) == 1.0
    assert score_code(fenced("def add(a, b):\n    return a - b"), ASSERTS, S) == 0.5
    for cheat in [
        "import sys\nsys.exit(0)",
        "import os\nos._exit(0)",
        "def add(a, b):\n    return 0\nimport atexit, os\natexit.register(lambda: os._exit(0))",
        "print('ok')\nraise SystemExit",
    ]:
        assert score_code(fenced(cheat), ASSERTS, S) == 0.0, cheat


def test_a_task_cannot_raise_the_run_limits():
    slow = fenced("import time\nt = time.time()\nwhile time.time() - t < 3:\n    pass\nprint(1)")
    info = {"tests": [{"input": "", "output": "1\n"}], "time_limit_s": 60}
    tight = CodeSettings(isolation="process", time_limit_s=1.0)
    assert score_code(slow, info, tight) == 0.0


def test_tests_beyond_the_cap_count_as_failed():
    info = {"tests": [{"input": "", "output": "1\n"}] * 4}
    capped = CodeSettings(isolation="process", max_tests=2)
    assert score_code(fenced("print(1)"), info, capped) == 0.5


def test_code_verifier_is_registered():
    task = Task(problem_id="p", prompt="add", task_type="code", verification_info=ASSERTS)
    assert verify(task, fenced("def add(a, b):\n    return a + b")) == 1.0


@pytest.mark.parametrize(
    "info, says",
    [
        ({}, "'tests' must be a non-empty list"),
        ({"tests": []}, "'tests' must be a non-empty list"),
        ({"tests": [{"input": "1"}]}, "tests[0]"),
        ({"tests": [{"assert": 5}]}, "tests[0]"),
        ({"tests": [{"assert": "assert 1"}], "time_limit_s": -1}, "time_limit_s"),
    ],
)
def test_bad_code_tasks_name_the_line_and_field(tmp_path, info, says):
    good = {"problem_id": "a", "prompt": "p", "task_type": "code", "verification_info": ASSERTS}
    bad = {**good, "problem_id": "b", "verification_info": info}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TaskError) as e:
        load_task_file(path)
    assert f"{path} line 2" in str(e.value) and says in str(e.value)


def test_example_file_is_current_and_its_references_pass():
    spec = importlib.util.spec_from_file_location(
        "make_code", ROOT / "data" / "make_code_examples.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = ROOT / "data" / "code_examples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == gen.examples(), (
        "data/code_examples.jsonl is stale: run python data/make_code_examples.py"
    )
    tasks = load_task_file(path)
    assert len(tasks) >= 200 and {t.task_type for t in tasks} == {"code"}
    for r in rows[:: len(rows) // 20]:  # two of every family, through the sandbox
        reference = fenced(r["metadata"]["reference"])
        assert score_code(reference, r["verification_info"], S) == 1.0, r["problem_id"]
        assert score_code(fenced("print('no')"), r["verification_info"], S) == 0.0


def test_prose_is_graded_without_running_anything(monkeypatch):
    import swarmrl.tasks.graders.code as cc

    def no_run(*a, **k):
        raise AssertionError("a process was started for a program that does not compile")

    monkeypatch.setattr(cc, "run_python", no_run)
    assert score_code("I think the answer is to add them.", PAIRS, S) == 0.0
    assert score_code(fenced("def add(a, b) return a + b"), ASSERTS, S) == 0.0
