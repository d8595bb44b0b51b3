"""The docs say only what is true of the code: every `swarmrl` flag and every config
key they name exists, a default they state is the code's, the README stays a front
door (its length, its requirements table, the tested-on line) and every figure it
states is one of docs/results.md's. Links between pages and configs/*.toml loading
are kept by test_docs_map.py and test_config.py.

Each check is also run on a made-up line, so that a check that could not fail is a
failure here too."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from swarmrl.cli import _parser
from swarmrl.config import RunConfig
from swarmrl.config.pretrain import PretrainConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
README_WORDS = 1500

FENCE = re.compile(r"```.*?```", re.S)
SPAN = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"\bswarmrl ([a-z][a-z-]*)((?:[^\n`\\]|\\\n)*)")
KEY = re.compile(r"^([a-z_]+(?:\.[a-z_0-9]+)+)\s*(?:=\s*(.+))?$")
FILE_ENDINGS = (
    ".py .md .json .jsonl .toml .png .log .key .pub .token .sqlite .parquet .gz .txt "
    ".safetensors .gguf .html .js .css .pt .yaml .csv .zst .lock .tar"
).split()
# flags of other programs that the docs name alone in backticks
OTHER_FLAGS = {
    "--no-deps",  # pip
    "--index-url",  # pip
    "--logdir",  # tensorboard
    "--nproc-per-node",  # torchrun
    "--durations",  # pytest
}


def pages() -> list[Path]:
    docs = ROOT / "docs"
    return [README, *sorted(docs.glob("*.md")), *sorted(docs.glob("reference/*.md"))]


def subcommand_flags() -> dict[str, set[str]]:
    out = {}
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = {s for a in sub._actions for s in a.option_strings}
    return out


def bench_flags() -> set[str]:
    """The flags of the benchmarks' own command lines (bench/*.py)."""
    found = set()
    for script in (ROOT / "bench").glob("*.py"):
        found |= set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", script.read_text()))
    return found


def code(text: str) -> str:
    """What the page shows as code: its fenced blocks and its backticked spans."""
    fenced = "\n".join(m.group(0) for m in FENCE.finditer(text))
    return fenced + "\n" + "\n".join(SPAN.findall(FENCE.sub("", text)))


def flag_problems(text: str, where: str) -> list[str]:
    """Flags of `swarmrl <command> ...` lines that the command lacks, and flags named
    alone (`--cheaters N`) that neither a command nor a benchmark has."""
    flags = subcommand_flags()
    every = set().union(*flags.values()) | {"--help", "--version"} | bench_flags()
    bad = []
    for m in COMMAND.finditer(code(text)):
        cmd, rest = m.group(1), m.group(2)
        if cmd not in flags:
            bad.append(f"{where}: `swarmrl {cmd}`: no such command")
            continue
        for f in FLAG.findall(rest):
            if f not in flags[cmd] | {"--help"}:
                bad.append(f"{where}: `swarmrl {cmd} ... {f}`: {cmd} has no {f}")
    for span in SPAN.findall(FENCE.sub("", text)):
        if span.startswith("--"):
            f = FLAG.match(span)
            if f and f.group(0) not in every | OTHER_FLAGS:
                bad.append(f"{where}: `{span}`: no swarmrl command has {f.group(0)}")
    return bad


def resolve(model: type[BaseModel], path: list[str]) -> tuple[bool, object]:
    """Whether a dotted path names a field of `model` (a dict field takes any
    sub-key), and the field's default."""
    field = model.model_fields.get(path[0])
    if field is None:
        return False, None
    if len(path) == 1:
        return True, field.get_default(call_default_factory=True)
    ann = field.annotation
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return resolve(ann, path[1:])
    return getattr(ann, "__origin__", ann) is dict, None


def config_keys(text: str) -> list[tuple[str, str | None, str]]:
    """(key, value or None, the span) for every `section.key` or `section.key = value`
    span whose first part is a section of the run's or DiLoCo's config."""
    sections = set(RunConfig.model_fields) | set(PretrainConfig.model_fields)
    out = []
    for span in SPAN.findall(text) + re.findall(r"^\s*(?:swarmrl|\$).*$", text, re.M):
        for piece in span.split():
            m = KEY.match(piece.strip(".,;:()"))
            if not m or m.group(1).split(".")[0] not in sections:
                continue
            if m.group(1).endswith(tuple(FILE_ENDINGS)):
                continue
            out.append((m.group(1), m.group(2), span))
        m = KEY.match(span.strip())
        if m and " " in span and m.group(1).split(".")[0] in sections:
            out.append((m.group(1), m.group(2), span))
    return out


def key_problems(text: str, where: str) -> list[str]:
    bad = []
    for key, _, span in config_keys(text):
        path = key.split(".")
        if not (resolve(RunConfig, path)[0] or resolve(PretrainConfig, path)[0]):
            bad.append(f"{where}: `{span}`: no config key {key}")
    return list(dict.fromkeys(bad))


def as_value(text: str) -> object:
    text = text.strip().strip("\"'")
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


# `key = value` (the default); `key` (default X [unit]); `key` (X [unit] by default)
VALUE = r"`?([\w.\"'-]+)`?(?:\s*(s|h|min|ms|units?)\b)?"
STATED_DEFAULT = re.compile(
    r"`([a-z_]+(?:\.[a-z_0-9]+)+)(?:\s*=\s*([^`]+))?`\s*\((?:(?:the )?default(?:s to|:)?\s*"
    + VALUE
    + r"|"
    + VALUE
    + r" by default|the default)\)"
)
SECONDS = {"s": 1, "ms": 0.001, "min": 60, "h": 3600}


def default_problems(text: str, where: str) -> list[str]:
    bad = []
    for m in STATED_DEFAULT.finditer(text):
        key, given, a, a_unit, b, b_unit = m.groups()
        stated, unit = (given, None) if given else (a, a_unit) if a else (b, b_unit)
        if stated is None:
            continue
        ok, default = resolve(RunConfig, key.split("."))
        if not ok:
            ok, default = resolve(PretrainConfig, key.split("."))
        value = as_value(stated)
        if unit in SECONDS and isinstance(value, int | float):
            value = value * SECONDS[unit]  # the docs say "24 h" of a key in seconds
        if ok and value != default:
            bad.append(f"{where}: `{key}` stated default {stated!r}, the code's is {default!r}")
    return bad


def test_every_flag_and_config_key_the_docs_name_exists():
    bad = []
    for page in pages():
        where = str(page.relative_to(ROOT))
        text = page.read_text()
        bad += flag_problems(text, where) + key_problems(text, where)
    assert not bad, "the docs name what the code does not have:\n" + "\n".join(bad)


def test_every_default_the_docs_state_is_the_codes():
    bad = []
    for page in pages():
        bad += default_problems(page.read_text(), str(page.relative_to(ROOT)))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "line, problem",
    [
        ("run `swarmrl rl --config c.toml --made-up-flag`", "rl has no --made-up-flag"),
        ("```\nswarmrl worker --orchestrator URL \\\n  --no-such 1\n```", "worker has no"),
        ("pass `--imaginary` to see", "no swarmrl command has --imaginary"),
        ("set `trainer.imaginary_knob = 3`", "no config key trainer.imaginary_knob"),
        ("`swarmrl rl trainer.lr=1e-5 task.no_such=1`", "no config key task.no_such"),
        ("`trainer.lr` (default 0.5)", "stated default '0.5'"),
        ("`orchestrator.file_seconds` (60 s by default)", "stated default '60'"),
        ("`orchestrator.validity_window_s` (default 2 h)", "stated default '2'"),
        ('`inference.backend = "hf"` (the default)', "stated default"),
    ],
)
def test_the_checks_catch_a_made_up_line(line, problem):
    found = flag_problems(line, "x") + key_problems(line, "x") + default_problems(line, "x")
    assert any(problem in f for f in found), found


def test_the_checks_pass_true_lines():
    lines = (
        "`swarmrl rl --config configs/tiny.toml --fresh trainer.lr=3e-4` and "
        '`inference.backend = "auto"` (the default), `trainer.steps`, `--resume`, '
        "`model.safetensors`, `task.gym_options.chain_sum`, "
        "`orchestrator.validity_window_s` (default 24 h)"
    )
    assert flag_problems(lines, "x") + key_problems(lines, "x") + default_problems(lines, "x") == []


def readme_prose() -> str:
    text = FENCE.sub("", README.read_text())
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's words, not its address
    return SPAN.sub("", text)  # commands and paths are not figures


# a measured figure: a decimal, or a number with a unit or a ratio sign
FIGURE = re.compile(
    r"(?<![\w.])(\d+(?:[.,]\d+)*(?:\.\d+)?)(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?"
    r"\s*(ms|s|min|minutes|GiB|GB|MB|KB|x|%|points)?(?![\w.])"
)


def readme_figures(text: str) -> list[str]:
    """Each figure as the README writes it: `0.615`, `14 GiB`, `5 min`."""
    out = []
    for m in FIGURE.finditer(text):
        number, unit = m.group(1), m.group(2)
        if "." in number or unit:
            out.append(f"{number} {unit}" if unit else number)
    return out


def stated_in(figure: str, text: str) -> bool:
    """Whether `text` states the figure, as a whole number (0.61 is not in 0.615),
    with the same unit where it has one (a space between them or not)."""
    number, _, unit = figure.partition(" ")
    pattern = rf"(?<![\w.]){re.escape(number)}(?![\w]|\.\d)"
    if unit:
        pattern += rf"[\s\u00a0]*{re.escape(unit)}(?!\w)"
    return re.search(pattern, text) is not None


def test_the_readme_is_a_front_door():
    text = README.read_text()
    words = len(FENCE.sub("", text).split())
    assert words <= README_WORDS, f"README.md has {words} words (at most {README_WORDS})"
    assert re.search(r"^\| *(OS|requirement)", text, re.M | re.I), "no requirements table"
    assert re.search(r"^\*\*Tested on", text, re.M), "no 'Tested on' line"
    assert "LICENSE" in text


def test_every_figure_the_readme_states_is_in_the_results():
    results = RESULTS.read_text()
    missing = sorted({f for f in readme_figures(readme_prose()) if not stated_in(f, results)})
    assert not missing, "README.md figures not in docs/results.md: " + ", ".join(missing)


def test_the_figure_check_sees_figures():
    assert readme_figures("went 0.045 -> 0.670 in 14 steps, p99 25 ms, 3 cores") == [
        "0.045",
        "0.670",
        "25 ms",
    ]
    assert stated_in("25 ms", "a p99 of 25 ms") and stated_in("0.61", "0.61 and 0.7")
    assert not stated_in("25 ms", "a p99 of 25 s") and not stated_in("0.61", "0.615")
    assert not stated_in("2.0", "12.0") and not stated_in("6.1 GiB", "6.1 MB")
