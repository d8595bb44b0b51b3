"""The code verifier: run a completion's Python program against the task's tests.

verification_info of a `code` task:

    {"tests": [{"input": "1 2\\n", "output": "3\\n"},      # stdin/stdout pair
               {"assert": "assert add(1, 2) == 3"}],       # assert-style test
     "time_limit_s": 2.0,                                   # optional, per test
     "memory_mb": 256}                                      # optional, per test

The program is the last fenced code block of the completion (```python or
bare ```), else the whole completion. A program that does not compile (most
completions that are not programs) scores 0 without running anything;
otherwise every test is its own sandboxed run (tasks/graders/sandbox.py), and a
program already graded for the same task in this process is not run again:

- a stdin/stdout test passes when the program exits with status 0 and its
  output equals the expected output, compared line by line with trailing
  whitespace and trailing empty lines ignored;
- an assert-style test runs the program followed by the test code and passes
  when the harness's token comes back (exiting early does not pass).

The reward is the fraction of tests passed, or (`code.reward = "all"`) 1 only
when every test passes, in which case grading stops at the first failure. A
task's own limits can only tighten the run's (`code.time_limit_s`,
`code.memory_mb`). Tests beyond `code.max_tests` are not run and count as
failed, so a task file cannot make grading arbitrarily expensive.
"""

from __future__ import annotations

import functools
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from swarmrl.tasks.graders.sandbox import MAX_CODE_BYTES, Limits, assert_program, run_python

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class CodeSettings:
    isolation: str = "auto"
    reward: str = "fraction"
    time_limit_s: float = 4.0
    memory_mb: int = 512
    max_tests: int = 32
    parallel: int = 2


_settings = CodeSettings()


def configure(cfg) -> None:
    """Take the run's `code` section (workers and validators call this at start,
    with the same config, so they grade alike)."""
    global _settings
    _settings = CodeSettings(
        cfg.isolation, cfg.reward, cfg.time_limit_s, cfg.memory_mb, cfg.max_tests, cfg.parallel
    )


def extract_program(completion: str) -> str:
    """The last fenced block marked python/py (or unmarked), else the whole text."""
    blocks = [
        body
        for lang, body in _FENCE.findall(completion)
        if lang.lower() in ("", "python", "py", "python3")
    ]
    return blocks[-1] if blocks else completion


def compiles(program: str) -> bool:
    """Whether the program is valid Python for the interpreter the sandbox runs (this
    one): compiling parses, it runs nothing. A program that does not compile fails
    every test, so it is graded without starting a process."""
    if len(program.encode()) > MAX_CODE_BYTES:
        return False
    try:
        compile(program, "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def validate_tests(info: dict) -> str | None:
    """Why `info` is not a valid code task's verification_info, or None."""
    tests = info.get("tests")
    if not isinstance(tests, list) or not tests:
        return "field 'tests' must be a non-empty list"
    for i, t in enumerate(tests):
        if not isinstance(t, dict):
            return f"tests[{i}] must be an object"
        if "assert" in t:
            if not isinstance(t["assert"], str) or set(t) != {"assert"}:
                return f'tests[{i}]: an assert-style test is {{"assert": code}}'
        elif set(t) == {"input", "output"}:
            if not all(isinstance(t[k], str) for k in ("input", "output")):
                return f"tests[{i}]: input and output must be strings"
        else:
            return f'tests[{i}]: expected {{"input", "output"}} or {{"assert"}}'
    for key in ("time_limit_s", "memory_mb"):
        if key in info and not (isinstance(info[key], int | float) and info[key] > 0):
            return f"field '{key}' must be a positive number"
    return None


def _limits(info: dict, s: CodeSettings) -> Limits:
    cpu = min(float(info.get("time_limit_s", s.time_limit_s)), s.time_limit_s)
    mem = min(int(info.get("memory_mb", s.memory_mb)), s.memory_mb)
    return Limits(cpu_s=max(1, round(cpu)), wall_s=2 * cpu + 2.0, memory_mb=mem)


def _passes(program: str, test: dict, limits: Limits, isolation: str) -> bool:
    if "assert" in test:
        code, token = assert_program(program, test["assert"])
        return run_python(code, "", limits, isolation, token=token).token_seen
    r = run_python(program, test["input"], limits, isolation)
    return r.ok and _lines(r.stdout) == _lines(test["output"])


def score_code(completion: str, info: dict, settings: CodeSettings | None = None) -> float:
    """Fraction of tests passed (or all-or-nothing), each test in the sandbox. The
    same program for the same task is graded once per process (samples of a group
    often write the same program)."""
    s = settings or _settings
    why = validate_tests(info)
    if why is not None:
        raise ValueError(f"code task: {why}")
    program = extract_program(completion)
    if not compiles(program):
        return 0.0  # fails every test: no process needed
    return _graded(program, json.dumps(info, sort_keys=True), s)


@functools.lru_cache(maxsize=4096)
def _graded(program: str, info_json: str, s: CodeSettings) -> float:
    info = json.loads(info_json)
    tests = info["tests"]
    limits = _limits(info, s)
    run = tests[: s.max_tests]
    if s.reward == "all":
        if len(run) < len(tests):
            return 0.0
        return 1.0 if all(_passes(program, t, limits, s.isolation) for t in run) else 0.0
    if s.parallel > 1 and len(run) > 1:
        with ThreadPoolExecutor(min(s.parallel, len(run))) as pool:
            passed = sum(pool.map(lambda t: _passes(program, t, limits, s.isolation), run))
    else:
        passed = sum(_passes(program, t, limits, s.isolation) for t in run)
    return passed / len(tests)
