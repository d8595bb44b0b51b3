"""The math verifier: answer extraction, equivalence on a table of equal and unequal
answers, and a bounded time on hostile ones."""

from __future__ import annotations

import time

import pytest

from swarmrl.tasks.graders.math import MathChecker, equivalent, extract_answer, score_math
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.schema import Task

EQUAL = [
    ("42", "42"),
    ("-7", "-7"),
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("0.5", "1/2"),
    ("3/4", "0.75"),
    (".25", "0.25"),
    ("50\\%", "0.5"),
    ("50%", "50"),
    ("0.5", "50\\%"),
    ("12.50", "12.5"),
    ("\\frac{1}{2}", "0.5"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}"),
    ("x = 3", "3"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("(1, 2]", "(1, 2]"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("2^{10}", "1024"),
    ("10^3", "1000"),
    ("(x+1)^2", "x^2 + 2x + 1"),
    ("\\$5", "5"),
    ("5 \\text{ cm}", "5"),
    ("9" * 300, "9" * 300),
]

UNEQUAL = [
    ("41", "42"),
    ("-7", "7"),
    ("0.51", "1/2"),
    ("\\frac{3}{4}", "0.76"),
    ("2\\sqrt{3}", "\\sqrt{8}"),
    ("\\{1, 3\\}", "\\{1, 2\\}"),
    ("(1, 2)", "[1, 2]"),
    ("x^2", "2x"),
    ("51\\%", "0.5"),
    ("1000", "1,001"),
    ("9" * 300, "9" * 299),
    ("", "1"),
    ("no answer here", "1"),
]

MALFORMED = [  # must answer False, never raise or hang
    ("\\frac{1}{2", "0.5"),
    ("\\sqrt{", "2"),
    ("}}}{{{", "1"),
    ("\\left( 1", "2"),
    ("$$$", "1"),
]

HOSTILE = [  # huge numbers and expressions SymPy would spend minutes on
    ("10^{10^{10}}", "1"),
    ("9^{9^{9^{9}}}", "2"),
    ("9" * 5000, "1"),
]


@pytest.mark.parametrize(("answer", "truth"), EQUAL)
def test_equal_answers(answer, truth):
    assert equivalent(answer, truth), (answer, truth)


@pytest.mark.parametrize(("answer", "truth"), UNEQUAL + MALFORMED)
def test_unequal_or_malformed_answers(answer, truth):
    assert not equivalent(answer, truth), (answer, truth)


def test_hostile_answers_are_cut_off_and_the_checker_recovers():
    checker = MathChecker(timeout_s=1.0)
    try:
        for answer, truth in HOSTILE:
            t0 = time.monotonic()
            assert not equivalent(answer, truth, checker)
            assert time.monotonic() - t0 < 10.0  # the bound plus a process start
        assert checker.timeouts >= 1
        assert equivalent("\\frac{1}{2}", "0.5", checker)  # a fresh checker took over
    finally:
        checker.close()


@pytest.mark.parametrize(
    ("completion", "pattern", "want"),
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", None, "\\frac{1}{2}"),
        ("first \\boxed{3}, on reflection \\boxed{4}", None, "4"),
        ("nested \\boxed{\\frac{a}{b^{2}}} done", None, "\\frac{a}{b^{2}}"),
        ("\\fbox{7}", None, "7"),
        ("We get 12 apples, then 15.", None, "15"),
        ("unclosed \\boxed{12 and then 13", None, "13"),
        ("Answer: B", r"Answer:\s*([A-D])", "B"),
        ("nothing numeric", None, None),
    ],
)
def test_answer_extraction(completion, pattern, want):
    assert extract_answer(completion, pattern) == want


def test_the_math_task_scores_through_the_verifier_table():
    task = Task(problem_id="p", prompt="1/2 as a decimal?", task_type="math",
                verification_info={"answer": "0.5"})  # fmt: skip
    assert verify(task, "It is \\boxed{\\frac{1}{2}}") == 1.0
    assert verify(task, "It is \\boxed{\\frac{1}{3}}") == 0.0
    assert score_math("I think 0.5", "\\frac{1}{2}") == 1.0


def test_the_example_math_file_is_current_and_its_answers_grade():
    """data/math_examples.jsonl loads as a task file, matches its generator, and
    its own answers grade 1 while a changed answer grades 0 (five per family)."""
    import importlib.util
    import json
    from pathlib import Path

    from swarmrl.tasks.sources.task_source import load_task_file

    root = Path(__file__).resolve().parents[2] / "data"
    spec = importlib.util.spec_from_file_location("make_math", root / "make_math_examples.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    path = root / "math_examples.jsonl"
    assert path.read_text() == "".join(json.dumps(r) + "\n" for r in make.examples()), (
        "run: python data/make_math_examples.py"
    )
    tasks = load_task_file(path)
    assert len(tasks) == 300
    for t in tasks[::12]:
        answer = t.verification_info["answer"]
        assert verify(t, f"Working... so \\boxed{{{answer}}}") == 1.0, t.problem_id
        assert verify(t, f"\\boxed{{{answer} + 1}}") == 0.0, t.problem_id
