"""The tools a model may call in a trajectory, and the text forms of a call.

Three forms (`env.syntax`), all plain text that any model can write, chat
template or not:

- `tag`: the model ends a span with `<calc>48 * (17 + 3)</calc>` or
  `<python>print(sum(range(10)))</python>`; the environment answers
  `<result>...</result>` and a newline.
- `equals`: the model ends a span with an arithmetic expression and `=`, as a
  person's calculator finishes "47 * 382 ="; the environment writes the value
  after it (" 17954") and the model goes on. SmolLM2-135M-Instruct writes this
  form by itself and almost never the tag (docs/multi-turn.md). Calculator only.
- `json`: the Hermes form that Qwen-style chat templates train their models to
  write, `<tool_call>{"name": "calc", "arguments": {"expression": "48 * 20"}}</tool_call>`
  (the Python tool: `{"name": "python", "arguments": {"code": "..."}}`), answered
  `<tool_response>...</tool_response>` and a newline; the same form as a
  verifiers taskset's tools (envs/verifiers_tools.py). A template's own turn
  tokens around the answer (a `tool` role) are not written.

The span ends at the call (`call_at_end`), and the model's next span follows the
answer (`answer_text`).

Every tool answers the same bytes to the same input under the same limits, so a
validator that runs it again gets what the worker got: the validator rejects a
trajectory whose tool output differs from its own run (envs/environment.py).

- `calculator`: arithmetic on integers and decimals (+ - * / // % ** and
  parentheses), evaluated by walking Python's own expression tree with bounds
  on sizes, never by `eval`. Integers are exact; a division's result is shown
  with 12 significant digits. Anything else is an error result, not an
  exception.
- `python`: a program run in the code sandbox's deterministic mode; the answer
  is what it printed (envs/python_tool.py, which says what it cannot make the
  same on two machines and how a validator treats that).
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

from swarmrl.envs.python_tool import PythonLimits, run_program

RESULT_CHARS = 400  # a tool's output is cut to this many characters

CALL = re.compile(r"<(calc|python)>(.*?)</\1>\s*\Z", re.DOTALL)
# digits, spaces and parentheses around at least one operator, then "=" at the end
EQUALS = re.compile(r"(\d[\d ()]*(?:[-+*/×x][\d ()]+)+)=\s*\Z")
# the json form: a span ends with a close tag (and blanks); its call starts at the last
# open tag before it
JSON_CALL = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)</tool_call>\s*\Z", re.DOTALL)
TOOLS = ("calc", "python")
SYNTAXES = ("tag", "equals", "json")
ARGUMENT = {"calc": "expression", "python": "code"}  # the json form's one argument per tool


@dataclass(frozen=True)
class CalcLimits:
    """The calculator's bounds: the same on every worker and validator (a tool run with
    looser limits answers differently, and its trajectory is rejected)."""

    max_expr_chars: int = 400
    max_digits: int = 200  # an integer operand or result longer than this is an error
    max_exponent: int = 256


@dataclass(frozen=True)
class ToolCall:
    tool: str  # "calc"; "" for a json call that cannot be read (`argument` says why)
    argument: str


def call_at_end(text: str, syntax: str = "tag") -> ToolCall | None:
    """The tool call that ends `text` (the model's span so far), if one does."""
    if syntax == "equals":
        m = EQUALS.search(text)
        return None if m is None else ToolCall("calc", m.group(1).replace("x", "*"))
    if syntax == "json":
        m = JSON_CALL.search(text)
        return None if m is None else _json_call(m.group(1))
    m = CALL.search(text)
    if m is None:
        return None
    return ToolCall(m.group(1), m.group(2))


MAX_NESTING = 32  # a json call nested deeper is refused before it is parsed


def read_json_call(text: str):
    """The JSON of a call, or a string saying why it cannot be read. The nesting is
    checked first: whether json.loads runs out of stack depends on how deep its caller
    already is, which differs between a worker and a validator."""
    import json

    depth, in_string, escaped = 0, False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return f"error: the call nests deeper than {MAX_NESTING} levels"
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except ValueError:
        return "error: the call is not JSON"


def plain_text(text: str) -> str:
    """`text` with what UTF-8 cannot hold (a lone surrogate from a JSON escape) replaced:
    a tool's input and output must be text every node can encode."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _json_call(text: str) -> ToolCall:
    """The json form's call, or ToolCall("", why it cannot be read)."""
    call = read_json_call(text)
    if isinstance(call, str):
        return ToolCall("", call)
    name = call.get("name") if isinstance(call, dict) else None
    args = call.get("arguments") if isinstance(call, dict) else None
    if not isinstance(name, str) or name not in ARGUMENT or not isinstance(args, dict):
        return ToolCall("", 'error: a call is {"name": "calc" or "python", "arguments": {...}}')
    value = args.get(ARGUMENT[name])
    if not isinstance(value, str) or set(args) != {ARGUMENT[name]}:
        return ToolCall("", f'error: {name} takes one argument, "{ARGUMENT[name]}", a string')
    if plain_text(value) != value:
        return ToolCall("", f'error: "{ARGUMENT[name]}" is not text UTF-8 can hold')
    return ToolCall(name, value)


def result_text(output: str) -> str:
    """How a tool's output is written back into the trajectory (the tag form)."""
    return f"<result>{output[:RESULT_CHARS]}</result>\n"


def answer_content(output: str) -> str:
    """A tool's output as the content of a tool turn (`env.tool_turns = "template"`)."""
    return plain_text(output)[:RESULT_CHARS]


def answer_text(output: str, syntax: str = "tag") -> str:
    """The environment's span for a tool's output, in the call's form."""
    output = plain_text(output)
    if syntax == "json":
        return f"<tool_response>{output[:RESULT_CHARS]}</tool_response>\n"
    return f" {output[:RESULT_CHARS]}" if syntax == "equals" else result_text(output)


class CalcError(ValueError):
    pass


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculator(expression: str, limits: CalcLimits = CalcLimits()) -> str:
    """The value of an arithmetic expression, or `error: <why>`."""
    if len(expression) > limits.max_expr_chars:
        return f"error: expression over {limits.max_expr_chars} characters"
    text = expression.strip().replace("×", "*").replace("^", "**")
    if not text.isascii():
        return "error: only ASCII arithmetic"
    try:
        tree = ast.parse(text, mode="eval")
        return _show(_value(tree.body, limits))
    except SyntaxError:
        return "error: not an arithmetic expression"
    except ZeroDivisionError:
        return "error: division by zero"
    except CalcError as e:
        return f"error: {e}"


def _value(node: ast.AST, lim: CalcLimits) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value, lim)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _value(node.operand, lim)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, lim), _value(node.right, lim)
        if isinstance(node.op, ast.Pow):
            if abs(right) > lim.max_exponent or (
                abs(left) > 1 and abs(right) * _digits(left) > lim.max_digits
            ):
                raise CalcError("power too large")
        return _bounded(_BINARY[type(node.op)](left, right), lim)
    raise CalcError("only numbers, + - * / // % ** and parentheses")


def _digits(v: int | float) -> int:
    return len(str(int(abs(v))))


def _bounded(v: int | float, lim: CalcLimits) -> int | float:
    if isinstance(v, complex):
        raise CalcError("a complex result")
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        raise CalcError("the result is not a finite number")
    if isinstance(v, int) and _digits(v) > lim.max_digits:
        raise CalcError(f"a number over {lim.max_digits} digits")
    return v


def _show(v: int | float) -> str:
    if isinstance(v, int):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.12g}"


def run_tool(
    call: ToolCall, limits: CalcLimits = CalcLimits(), python: PythonLimits | None = None
) -> str:
    """The output of one call."""
    if call.tool == "calc":
        return calculator(call.argument, limits)
    if call.tool == "python":
        return run_program(call.argument, python or PythonLimits())
    return f"error: no tool named {call.tool!r}"
