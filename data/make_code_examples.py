"""Generate data/code_examples.jsonl: a few hundred small Python tasks with tests,
for trying the `code` verifier and task files (not a benchmark).

Ten families, 24 tasks each, from a fixed seed. Each task is a short
programming problem with concrete parameters (a modulus, a separator, a word
to count...), so tasks of one family differ. Half the families read stdin and
print (stdin/stdout tests), half define a function (assert-style tests).
Expected outputs are computed here by a reference solution in this file, and
`REFERENCE` keeps that solution as a program so a test can check that it passes
its own task's tests through the sandbox.

    python data/make_code_examples.py   # rewrites data/code_examples.jsonl
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

PER_FAMILY = 24
TESTS = 4
ASK = "\nWrite a Python program. Give the whole program in one ```python code block."
ASK_FN = "\nWrite the function in Python. Give it in one ```python code block."


def _ints(rng, n, lo=-50, hi=50):
    return [rng.randint(lo, hi) for _ in range(n)]


def sum_mod(rng):
    m = rng.randint(5, 97)
    prompt = (
        "The input is one line of space-separated integers. Print the sum of the integers "
        f"modulo {m} (a number from 0 to {m - 1})."
    )
    program = f"print(sum(map(int, input().split())) % {m})\n"
    tests = []
    for _ in range(TESTS):
        xs = _ints(rng, rng.randint(1, 8))
        tests.append({"input": " ".join(map(str, xs)) + "\n", "output": f"{sum(xs) % m}\n"})
    return prompt, program, tests


def count_word(rng):
    word = rng.choice(["cat", "sun", "red", "map", "ice", "owl", "jam"])
    prompt = (
        "The input is one line of lowercase words separated by spaces. Print how many of "
        f"them are exactly the word '{word}'."
    )
    program = f"print(input().split().count({word!r}))\n"
    pool = [word, "dog", "sea", "tree", word + "s", "a" + word]
    tests = []
    for _ in range(TESTS):
        ws = [rng.choice(pool) for _ in range(rng.randint(1, 9))]
        tests.append({"input": " ".join(ws) + "\n", "output": f"{ws.count(word)}\n"})
    return prompt, program, tests


def join_reversed(rng):
    sep = rng.choice(["-", ",", "+", ":", "|"])
    prompt = (
        "The first line holds n; the next n lines hold one word each. Print the words in "
        f"reverse order on one line, joined by '{sep}'."
    )
    program = (
        "n = int(input())\nwords = [input().strip() for _ in range(n)]\n"
        f"print({sep!r}.join(reversed(words)))\n"
    )
    tests = []
    for _ in range(TESTS):
        ws = [
            "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 5)))
            for _ in range(rng.randint(1, 6))
        ]
        tests.append({"input": f"{len(ws)}\n" + "".join(w + "\n" for w in ws), "output": sep.join(reversed(ws)) + "\n"})  # fmt: skip
    return prompt, program, tests


def multiples(rng):
    k = rng.randint(2, 9)
    prompt = (
        f"The input is one integer n (1 <= n <= 1000). Print how many integers from 1 to n "
        f"inclusive are divisible by {k}."
    )
    program = f"print(int(input()) // {k})\n"
    tests = []
    for _ in range(TESTS):
        n = rng.randint(1, 1000)
        tests.append({"input": f"{n}\n", "output": f"{n // k}\n"})
    return prompt, program, tests


def max_minus_min(rng):
    prompt = (
        "The input is one line of space-separated integers. Print the largest minus the "
        "smallest, then on the next line the number of distinct values."
    )
    program = (
        "xs = list(map(int, input().split()))\nprint(max(xs) - min(xs))\nprint(len(set(xs)))\n"
    )
    tests = []
    for _ in range(TESTS):
        xs = _ints(rng, rng.randint(1, 8), -9, 9)
        tests.append({"input": " ".join(map(str, xs)) + "\n", "output": f"{max(xs) - min(xs)}\n{len(set(xs))}\n"})  # fmt: skip
    return prompt, program, tests


def fn_digit_sum(rng):
    base = rng.choice([2, 3, 5, 7, 8, 10, 16])
    prompt = (
        f"Define a function digit_sum(n) that returns the sum of the digits of the "
        f"non-negative integer n written in base {base}."
    )
    program = (
        "def digit_sum(n):\n    total = 0\n    while n:\n"
        f"        total += n % {base}\n        n //= {base}\n    return total\n"
    )
    scope: dict = {}
    exec(program, scope)
    tests = []
    for _ in range(TESTS):
        n = rng.randint(0, 5000)
        tests.append({"assert": f"assert digit_sum({n}) == {scope['digit_sum'](n)}"})
    return prompt, program, tests


def fn_clamp_list(rng):
    lo, hi = sorted(rng.sample(range(-20, 21), 2))
    prompt = (
        f"Define a function clamp_all(xs) that returns a new list in which every number of "
        f"the list xs below {lo} becomes {lo} and every number above {hi} becomes {hi}."
    )
    program = f"def clamp_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n"
    tests = []
    for _ in range(TESTS):
        xs = _ints(rng, rng.randint(0, 6), -30, 30)
        want = [min(max(x, lo), hi) for x in xs]
        tests.append({"assert": f"assert clamp_all({xs}) == {want}"})
    return prompt, program, tests


def fn_rotate(rng):
    k = rng.randint(1, 5)
    prompt = (
        f"Define a function rotate(s) that returns the string s rotated left by {k} "
        f"characters (the first {k} characters move to the end; use k mod len(s), and "
        "return the empty string unchanged)."
    )
    program = f"def rotate(s):\n    if not s:\n        return s\n    k = {k} % len(s)\n    return s[k:] + s[:k]\n"
    scope: dict = {}
    exec(program, scope)
    tests = []
    for _ in range(TESTS):
        s = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(0, 8)))
        tests.append({"assert": f"assert rotate({s!r}) == {scope['rotate'](s)!r}"})
    return prompt, program, tests


def fn_count_runs(rng):
    ch = rng.choice("abxyz01")
    prompt = (
        f"Define a function longest_run(s) that returns the length of the longest block of "
        f"consecutive '{ch}' characters in the string s (0 if there is none)."
    )
    program = (
        "def longest_run(s):\n    best = cur = 0\n    for c in s:\n"
        f"        cur = cur + 1 if c == {ch!r} else 0\n        best = max(best, cur)\n    return best\n"
    )
    scope: dict = {}
    exec(program, scope)
    tests = []
    for _ in range(TESTS):
        s = "".join(rng.choices(ch + "qk", k=rng.randint(0, 12)))
        tests.append({"assert": f"assert longest_run({s!r}) == {scope['longest_run'](s)}"})
    return prompt, program, tests


def fn_nth_term(rng):
    a, b = rng.randint(0, 5), rng.randint(1, 5)
    prompt = (
        f"Define a function term(n) that returns the n-th term (n >= 0) of the sequence "
        f"t(0) = {a}, t(1) = {b}, t(n) = t(n-1) + 2*t(n-2)."
    )
    program = (
        f"def term(n):\n    x, y = {a}, {b}\n    for _ in range(n):\n"
        "        x, y = y, y + 2 * x\n    return x\n"
    )
    scope: dict = {}
    exec(program, scope)
    tests = []
    for _ in range(TESTS):
        n = rng.randint(0, 30)
        tests.append({"assert": f"assert term({n}) == {scope['term'](n)}"})
    return prompt, program, tests


STDIO = {"sum_mod": sum_mod, "count_word": count_word, "join_reversed": join_reversed,
         "multiples": multiples, "max_minus_min": max_minus_min}  # fmt: skip
FUNCTIONS = {"digit_sum": fn_digit_sum, "clamp_list": fn_clamp_list, "rotate": fn_rotate,
             "longest_run": fn_count_runs, "nth_term": fn_nth_term}  # fmt: skip


def examples(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for name, make in {**STDIO, **FUNCTIONS}.items():
        ask = ASK if name in STDIO else ASK_FN
        for i in range(PER_FAMILY):
            prompt, program, tests = make(rng)
            out.append({
                "problem_id": f"{name}-{i}",
                "prompt": prompt + ask,
                "task_type": "code",
                "verification_info": {"tests": tests, "time_limit_s": 2},
                "metadata": {"family": name, "reference": program},
            })  # fmt: skip
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("code_examples.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in examples()))
