"""The Python tool (envs/python_tool.py): programs the model writes, run in the code
sandbox's deterministic mode, answered the same on a worker and a validator; where the
answer cannot be settled, the validator refuses the file without blame."""

from __future__ import annotations

import pytest

from swarmrl.config import load_config
from swarmrl.envs.environment import ToolEnvironment, environment_of
from swarmrl.envs.python_tool import (
    TIME_LIMIT,
    PythonLimits,
    check_interpreter,
    interpreter_version,
    run_program,
)
from swarmrl.envs.tools import call_at_end
from swarmrl.errors import ConfigError
from swarmrl.tasks.graders.sandbox import namespaces_available, run_python
from tests.unit.test_multiturn import EOS, TOK, _replay, _trajectory

ISOLATION = "namespace" if namespaces_available() is None else "process"
FAST = PythonLimits(cpu_s=1, memory_mb=256, isolation=ISOLATION)
# what an unseeded interpreter prints differently on every run
VARYING = "import os, random, time\nprint(set('abcdefgh'), random.random(), time.time(), os.urandom(4).hex())"


def test_a_programs_output_repeats_where_plain_python_would_not():
    plain = {run_python(VARYING, deterministic=False).stdout for _ in range(2)}
    assert len(plain) == 2  # the test program does vary without the deterministic mode
    runs = {run_program(VARYING, FAST) for _ in range(3)}
    assert len(runs) == 1
    (out,) = runs
    assert out.startswith("{") and "1700000000.001" in out


def test_answers_for_output_errors_and_limits():
    assert run_program("print(6 * 7)", FAST) == "42\n"
    assert run_program("print('a')\n1 / 0", FAST) == "a\nZeroDivisionError: division by zero"
    assert run_program("while True:\n    pass", FAST) == TIME_LIMIT
    assert run_program("x = bytearray(1 << 30)", PythonLimits(1, 64, ISOLATION)) == "MemoryError"
    assert run_program("while True:\n    print('x' * 1000)", FAST).startswith("error: ")
    # the network is closed in either isolation (an audit hook, or no interface at all)
    net = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9))", FAST)
    assert net.startswith(("PermissionError", "OSError", "ConnectionRefusedError")), net


def test_the_python_tool_is_called_in_the_json_form_too():
    env = ToolEnvironment(("python",), syntax="json", python=FAST)
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    assert env.respond(call, 0) == "<tool_response>42\n</tool_response>\n"
    loop = '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
    limit = env.respond(loop, 0)
    assert limit == f"<tool_response>{TIME_LIMIT}</tool_response>\n"
    assert "time limit" in env.doubt(loop, 0, limit, "<tool_response>1</tool_response>\n")


def test_the_runs_limits_hold_for_every_node_that_builds_the_environment():
    """Workers and validators build the tool from `[env]`: the same CPU and memory
    limits on both, so a program over them is an error everywhere."""
    cfg = load_config(
        None, ['env.kind="tools"', 'env.tools=["python"]', "env.python_cpu_s=1",
               "env.python_memory_mb=64", f'env.python_isolation="{ISOLATION}"'],
    )  # fmt: skip
    env = environment_of(cfg)
    assert env.python == PythonLimits(1, 64, ISOLATION)
    assert env.respond("<python>while True: pass</python>", 0) == f"<result>{TIME_LIMIT}</result>\n"
    assert (
        env.respond("<python>b = bytearray(1 << 28)</python>", 0)
        == "<result>MemoryError</result>\n"
    )
    # the calculator is not offered in this run
    assert "not offered" in env.respond("<calc>1+1</calc>", 0)


def test_the_python_tool_needs_the_tag_form_and_one_isolation():
    with pytest.raises(ConfigError, match="tag form"):
        ToolEnvironment(("calc", "python"), syntax="equals", python=FAST)
    with pytest.raises(ConfigError, match="one sandbox isolation"):
        ToolEnvironment(("python",), python=PythonLimits(isolation="auto"))
    with pytest.raises(ConfigError, match="tag form"):
        environment_of(load_config(
            None, ['env.kind="tools"', 'env.tools=["python"]', 'env.syntax="equals"',
                   f'env.python_isolation="{ISOLATION}"']
        ))  # fmt: skip
    assert call_at_end("x <python>print(1)</python>").tool == "python"
    assert call_at_end("47 * 2 = ", "equals").tool == "calc"


def test_every_node_runs_programs_with_the_runs_python(tmp_path):
    """The orchestrator writes its interpreter's version into the run config it serves;
    a node on another version refuses to build the tool (workers build it from that
    config, validators compare it with their own)."""
    from tests.unit.orch_util import Orch

    tools = ['env.kind="tools"', 'env.tools=["python"]', f'env.python_isolation="{ISOLATION}"']
    served = Orch(tmp_path / "a", *tools).http.get("/v1/run").json()["config"]["env"]
    assert served["python_version"] == interpreter_version()
    assert environment_of(load_config(None, [*tools, f'env.python_version="{served["python_version"]}"']))  # fmt: skip
    with pytest.raises(ConfigError, match=r"runs programs with Python 3\.1 .* runs Python 3\."):
        environment_of(load_config(None, [*tools, 'env.python_version="3.1"']))
    with pytest.raises(ConfigError):
        check_interpreter("3.1")
    check_interpreter("")  # a node's own config, before the run's: its own interpreter
    # a run without the tool serves no version, and pins none
    plain = Orch(tmp_path / "b").http.get("/v1/run").json()["config"]["env"]
    assert plain["python_version"] == ""


def test_a_forged_output_is_a_cheat_and_an_unsettled_one_is_nobodys_fault():
    env = ToolEnvironment(("python",), max_turns=3, python=FAST)
    call = "so <python>print(sum(range(10)))</python>"
    assert _replay(env, (call, 1), ("<result>45\n</result>\n", 0), ("45", 1)) is None
    got = _replay(env, (call, 1), ("<result>46\n</result>\n", 0), ("46", 1))
    assert got[0] == "environment", got
    # a program whose output changes between runs: the validator's own two runs differ
    clock = "<python>print(id(object()))</python>"  # an address: differs run to run
    got = _replay(env, (clock, 1), ("<result>2026-01-01 00:00:00\n</result>\n", 0), ("x", 1))
    assert got[0] == "unverifiable" and "differs between two runs" in got[1], got
    # a program at the time limit on one side: speeds differ between machines
    slow = "<python>n = 0\nwhile True: n += 1</python>"
    got = _replay(env, (slow, 1), ("<result>12345\n</result>\n", 0), ("x", 1))
    assert got[0] == "unverifiable" and "time limit" in got[1], got
    fast = "<python>print(2 ** 10)</python>"
    got = _replay(env, (fast, 1), (f"<result>{TIME_LIMIT}</result>\n", 0), ("x", 1))
    assert got[0] == "unverifiable", got
    # only the time limit's exact answer: a forgery that quotes it is a forgery
    quoted = f"<result>1025 {TIME_LIMIT}</result>\n"
    assert _replay(env, (fast, 1), (quoted, 0), ("x", 1))[0] == "environment"
    # an unsettled turn does not hide a forged one after it
    two = ToolEnvironment(("calc", "python"), max_turns=3, python=FAST)
    parts = [(clock, 1), ("<result>2026-01-01 00:00:00\n</result>\n", 0),
             (" <calc>2+2</calc>", 1), ("<result>5</result>\n", 0), ("x", 1)]  # fmt: skip
    assert _replay(two, *parts)[0] == "environment"
    # the calculator's answers have no doubt: a difference there is always a forgery
    calc = ToolEnvironment(("calc", "python"), max_turns=3, python=FAST)
    got = _replay(calc, ("<calc>2+2</calc>", 1), ("<result>5</result>\n", 0), ("x", 1))
    assert got[0] == "environment", got


def test_a_python_tool_run_with_looser_memory_is_caught():
    from swarmrl.sim.tool_cheats import loosened

    env = ToolEnvironment(("python",), max_turns=2, python=PythonLimits(1, 64, ISOLATION))
    call = "<python>b = bytearray(1 << 27)\nprint(len(b))</python>"
    strict = env.respond(call, 0)
    assert strict == "<result>MemoryError</result>\n"
    loose = loosened(env).respond(call, 0)
    assert loose == f"<result>{1 << 27}\n</result>\n"
    assert _replay(env, (call, 1), (loose, 0), ("ok", 1))[0] == "environment"


def test_clocks_and_dates_read_the_same_on_every_run():
    code = (
        "import time, datetime\n"
        "print(time.strftime('%Y-%m-%d %H'), time.ctime(), time.localtime().tm_hour,\n"
        "      datetime.datetime.now(), datetime.date.today(), datetime.datetime.utcnow())"
    )
    runs = {run_program(code, FAST) for _ in range(2)}
    assert len(runs) == 1 and "2023-11-14" in runs.pop()


def test_the_validator_raises_an_unsettled_answer_only_when_nothing_else_fails():
    """_check_environment returns the `unverifiable` refusal for the validator to raise
    after the model checks, and raises a forgery in any sample at once."""
    from types import SimpleNamespace

    from swarmrl.validator.checks import Reject, _check_environment

    cfg = load_config(
        None, ['env.kind="tools"', 'env.tools=["calc", "python"]', "env.python_cpu_s=1",
               f'env.python_isolation="{ISOLATION}"', "sampling.max_new_tokens=200"],
    )  # fmt: skip
    ctx = SimpleNamespace(cfg=cfg, tokenizer=TOK, eos_id=EOS)

    def row(*parts):
        tokens, mask = _trajectory(*parts)
        return {"completion_tokens": tokens, "completion_mask": mask, "group": 0}

    clock = "<python>print(id(object()))</python>"  # an address: differs run to run
    unsettled = row((clock, 1), ("<result>2026-01-01\n</result>\n", 0), ("x", 1))
    honest = row(("<calc>2+2</calc>", 1), ("<result>4</result>\n", 0), ("x", 1))
    forged = row(("<calc>2+2</calc>", 1), ("<result>5</result>\n", 0), ("x", 1))
    plan = [SimpleNamespace(task=None)]  # the built-in tools answer alike for every task
    doubt = _check_environment(ctx, [honest, unsettled], plan)
    assert doubt is not None and doubt.check == "unverifiable" and doubt.samples == [1]
    assert _check_environment(ctx, [honest, honest], plan) is None
    with pytest.raises(Reject) as e:
        _check_environment(ctx, [unsettled, forged], plan)
    assert e.value.check == "environment" and e.value.samples == [1]
