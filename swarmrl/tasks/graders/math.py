"""The math verifier: extract a completion's final answer and compare it with the
ground truth symbolically, in bounded time.

Extraction (`extract_answer`): the content of the last `\\boxed{...}` (or
`\\fbox{...}`), braces balanced; else the last match of a pattern (by default
the last number). Comparison (`equivalent`):

1. plain numbers on both sides (integers, decimals, fractions `a/b`,
   thousands separators, a trailing percent sign) are compared exactly as
   rationals, in this process: no parser, no time bound needed;
2. anything else goes to `math-verify` (LaTeX and expressions parsed into
   SymPy: fractions, roots, equivalent forms, sets, intervals), run in a
   separate checker process that is killed and replaced when one comparison
   takes longer than `timeout_s`. A timeout scores 0. math-verify's own
   timeouts use `signal.alarm`, which works only on the main thread (a worker's
   heartbeat thread and a validator's threads are not), so they are turned
   off and the process boundary is the bound instead;
3. if math-verify cannot parse either side, the plain-number rule of 1 is
   the fallback.

A percent is read both ways: `50\\%` equals `50` and `0.5` (datasets write
the one, models the other). The checker process is started on first use,
once per process that grades (a worker, a validator), and serves comparisons
one at a time over a pipe (JSON lines); `python -m swarmrl.tasks.graders.math`
is that process.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

from swarmrl.tasks.graders.checker import CheckerProcess, serve

log = logging.getLogger("swarmrl.tasks.graders.math")

DEFAULT_TIMEOUT_S = 2.0  # per comparison; sympy answers honest ones in well under 0.1 s
MAX_ANSWER_CHARS = (
    2000  # longer answers are not compared (a completion can be long; an answer is not)
)
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
DEFAULT_PATTERN = _NUMBER
_PLAIN = re.compile(
    r"^\s*\$?\s*(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+))?\s*(?P<pct>\\?%)?\s*\$?\s*$"
)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_answer(completion: str, pattern: str | None = None) -> str | None:
    """The last `\\boxed{...}` content, else the last match of `pattern` (default:
    the last number), else None."""
    last = None
    for m in _BOX.finditer(completion):
        depth, i = 1, m.end()
        while i < len(completion) and depth:
            depth += {"{": 1, "}": -1}.get(completion[i], 0)
            i += 1
        if depth == 0:
            last = completion[m.end() : i - 1].strip()
    if last is not None:
        return last
    found = re.findall(pattern or DEFAULT_PATTERN, completion)
    if not found:
        return None
    got = found[-1]
    return got if isinstance(got, str) else next((g for g in reversed(got) if g), None)


def plain_values(text: str) -> set[Fraction] | None:
    """The rational values a plain number may mean (two for a percent), or None
    when `text` is not a plain number."""
    m = _PLAIN.match(text)
    if m is None or len(text) > 400:
        return None
    value = Fraction(m["num"].replace(",", ""))
    if m["den"] is not None:
        if int(m["den"]) == 0:
            return None
        value /= int(m["den"])
    return {value, value / 100} if m["pct"] else {value}


def _plain_equal(a: str, b: str) -> bool | None:
    va, vb = plain_values(a), plain_values(b)
    if va is None or vb is None:
        return None
    return bool(va & vb)


def _readings(text: str) -> list[str]:
    """The text, or for a trailing percent both `x` and `(x)/100`."""
    stripped = re.sub(r"\s*\\?%\s*(\$?)\s*$", r"\1", text)
    if stripped == text:
        return [text]
    return [stripped, f"({stripped.strip().strip('$')})/100"]


def _one_number(text: str) -> set[Fraction] | None:
    found = re.findall(_NUMBER, text)
    return plain_values(found[0]) if len(found) == 1 else None


UNPARSED = "unparsed"  # math-verify found no expression on one side


class MathChecker(CheckerProcess):
    """The math-verify checker process (tasks/graders/checker.py)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__("swarmrl.tasks.graders.math", timeout_s)

    def compare(self, answer: str, truth: str) -> bool | str | None:
        """True/False from math-verify, UNPARSED, or None if it did not answer within
        the timeout."""
        return self.call([answer, truth])


_checker = MathChecker()


def equivalent(answer: str, truth: str, checker: MathChecker | None = None) -> bool:
    """Whether `answer` means `truth` (module docstring: plain numbers, then
    math-verify in a bounded process, then plain numbers as the fallback)."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    plain = _plain_equal(answer, truth)
    if plain is not None:
        return plain
    checker = checker or _checker
    for a in _readings(answer):
        for t in _readings(truth):
            got = checker.compare(a, t)
            if got == UNPARSED:  # the fallback: one plain number on each side
                na, nt = _one_number(a), _one_number(t)
                got = na is not None and nt is not None and bool(na & nt)
            if got is True:
                return True
    return False


def score_math(completion: str, truth: str, pattern: str | None = None) -> float:
    """1.0 if the completion's extracted answer equals `truth`, else 0.0."""
    answer = extract_answer(completion, pattern)
    if answer is None:
        return 0.0
    return 1.0 if equivalent(answer, str(truth)) else 0.0


# -- the checker process ------------------------------------------------------------


def _latex(text: str) -> str:
    text = text.strip()
    return text if text.startswith("$") else f"${text}$"


def _judge(request: list) -> bool | str:
    from math_verify import parse, verify

    answer, truth = request
    try:
        gold = parse(_latex(truth), parsing_timeout=None)
        pred = parse(_latex(answer), parsing_timeout=None)
        if not gold or not pred:
            return UNPARSED
        return bool(verify(gold, pred, timeout_seconds=None))
    except Exception:  # recovered: what math-verify cannot handle is graded as unparsed
        return UNPARSED


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # math-verify warns that its timeouts are off
    import math_verify  # noqa: F401  (imported before "ready": the first check is not slowed)

    serve(_judge)
