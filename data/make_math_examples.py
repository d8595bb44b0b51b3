"""Generate data/math_examples.jsonl: a few hundred small math tasks with exact
answers, for trying the `math` verifier and task files (not a benchmark).

Five families, 60 tasks each, from a fixed seed: sums of fractions (answers
as reduced LaTeX fractions), percentages of a number, one linear equation,
simplifying a square root (answers like 6\\sqrt{2}) and the greatest common
divisor. Every prompt asks for the final answer in \\boxed{}.

    python data/make_math_examples.py   # rewrites data/math_examples.jsonl
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from pathlib import Path

PER_FAMILY = 60
ASK = " Put the final answer in \\boxed{}."


def latex(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def fractions(rng: random.Random) -> tuple[str, str]:
    a = Fraction(rng.randint(1, 9), rng.randint(2, 12))
    b = Fraction(rng.randint(1, 9), rng.randint(2, 12))
    return f"Compute ${latex(a)} + {latex(b)}$ as a reduced fraction.", latex(a + b)


def percent(rng: random.Random) -> tuple[str, str]:
    p, n = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 45, 50, 60, 75]), rng.randint(2, 60) * 4
    value = Fraction(p * n, 100)
    return f"What is {p}% of {n}?", latex(value)


def linear(rng: random.Random) -> tuple[str, str]:
    a, x, b = rng.randint(2, 9), rng.randint(-12, 12), rng.randint(-20, 20)
    return f"Solve for $x$: ${a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}$.", str(x)


def root(rng: random.Random) -> tuple[str, str]:
    k, m = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11])
    return f"Simplify $\\sqrt{{{k * k * m}}}$.", f"{k}\\sqrt{{{m}}}"


def gcd(rng: random.Random) -> tuple[str, str]:
    g = rng.randint(2, 30)
    a, b = g * rng.randint(2, 20), g * rng.randint(2, 20)
    return f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b))


FAMILIES = {"fractions": fractions, "percent": percent, "linear": linear, "root": root, "gcd": gcd}


def examples(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for name, make in FAMILIES.items():
        for i in range(PER_FAMILY):
            prompt, answer = make(rng)
            out.append({
                "problem_id": f"{name}-{i}",
                "prompt": prompt + ASK,
                "task_type": "math",
                "verification_info": {"answer": answer},
                "metadata": {"family": name},
            })  # fmt: skip
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("math_examples.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in examples()))
    print(f"wrote {path}")
