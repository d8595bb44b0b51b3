"""The tool environment (issue 26, first part): the calculator's answers and refusals,
the text form of a call, and the refusal of an environment that does not answer the
same way twice (the replay of a trajectory is tested in test_multiturn.py)."""

from __future__ import annotations

import itertools

import pytest

from swarmrl.config import TaskConfig
from swarmrl.envs.environment import ToolEnvironment, check_deterministic
from swarmrl.envs.tools import ToolCall, calculator, call_at_end
from swarmrl.errors import ConfigError
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.sources.generated import describe_level, multiplication


@pytest.mark.parametrize(
    "expr, want",
    [
        ("4821 * 377", "1817517"),
        ("(12 + 7) / 4", "4.75"),
        ("10 / 4 * 2", "5"),
        ("2 ** 10 - -3", "1027"),
        ("17 // 5", "3"),
        ("17 // 5, 2", "error: only numbers, + - * / // % ** and parentheses"),  # a tuple
        ("7 % 0", "error: division by zero"),
        ("1 / 3", "0.333333333333"),
        ("12 × 3 ^ 2", "108"),
        ("__import__('os').system('true')", "error: only numbers, + - * / // % ** and parentheses"),
        ("9 ** 9 ** 9", "error: power too large"),
        ("10 ** 250", "error: power too large"),
        ("1e308 * 10", "error: the result is not a finite number"),
        ("(-8) ** 0.5", "error: a complex result"),
        ("x + 1", "error: only numbers, + - * / // % ** and parentheses"),
        ("٣ + 1", "error: only ASCII arithmetic"),
        ("1" * 500, "error: expression over 400 characters"),
    ],
)
def test_calculator_answers_or_says_why_not(expr, want):
    assert calculator(expr) == want


def test_a_call_is_a_tag_at_the_end_of_the_span():
    assert call_at_end("Let me compute. <calc>48 * 21</calc>") == ToolCall("calc", "48 * 21")
    assert call_at_end("<calc>1+1</calc>\n") == ToolCall("calc", "1+1")
    assert call_at_end("<calc>1+1</calc> so the answer is 2") is None  # not at the end
    assert call_at_end("The answer is 1008.") is None
    assert call_at_end("<python>print(1)</python>") == ToolCall("python", "print(1)")
    assert call_at_end("<shell>ls</shell>") is None  # no such tool


def test_the_environment_answers_calls_and_ends_on_an_answer_or_the_turn_limit():
    env = ToolEnvironment(max_turns=3)
    assert env.respond("<calc>48 * 21</calc>", 0) == "<result>1008</result>\n"
    assert env.respond("So it is 1008.", 1) is None
    assert env.respond("<calc>1 + 1</calc>", 2) is None  # the third span is the last
    with pytest.raises(ConfigError, match="unknown tools"):
        ToolEnvironment(tools=("shell",))


def test_an_environment_that_answers_differently_is_refused_at_start():
    check_deterministic(ToolEnvironment())
    counter = itertools.count()

    class Clock(ToolEnvironment):
        def respond(self, span, turn):
            return f"<result>{next(counter)}</result>\n"

    with pytest.raises(ConfigError, match="not deterministic"):
        check_deterministic(Clock())


def test_the_demo_task_needs_the_product_exactly():
    cfg = TaskConfig(name="multiplication", digits=2)
    t = multiplication(cfg, "eval", 7, 0)
    a, b = t.metadata["a"], t.metadata["b"]
    assert 10 <= a <= 99 and 100 <= b <= 999 and t.prompt == f"What is {a} * {b}?"
    assert verify(t, f"<calc>{a}*{b}</calc> so {a * b}") == 1.0
    assert verify(t, str(a * b + 1)) == 0.0
    assert multiplication(cfg, "eval", 7, 0) == t  # a pure function of its inputs
    assert describe_level(cfg, 1) == "products of 3- and 4-digit numbers"


def test_the_calculator_never_raises():
    """Whatever a model writes inside the tag, the answer is a result or an error line."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    chars = st.sampled_from(list("0123456789+-*/%().e ^×x_'") + ["**", "//", "1e308"])

    @settings(max_examples=400, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(st.lists(chars, max_size=120).map("".join) | st.text(max_size=60))
    def run(expr):
        out = calculator(expr)
        assert isinstance(out, str) and out

    run()
    assert calculator("(" * 300 + "1" + ")" * 300).startswith("error")
    assert calculator("-" * 399 + "1") == "-1"
