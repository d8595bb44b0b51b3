"""The docs stand on their own: the architecture map names only paths that exist,
every relative link between the Markdown pages resolves (file and heading), and no
tracked file cites anything outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
TOP_DIRS = ("swarmrl/", "tests/", "bench/", "docs/", "configs/")

# a backticked path: a name with a slash or a .py/.md/.toml ending, no spaces
CODE_SPAN = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def map_paths(text: str) -> list[str]:
    """The repository paths the map names in backticks: `inference/worker.py`,
    `launch/` (relative to swarmrl/), or starting with one of TOP_DIRS."""
    out = []
    for span in CODE_SPAN.findall(text):
        span = span.rstrip(".,:;")
        if span.startswith(("http", "/", "runs/", "<")) or "*" in span or "=" in span:
            continue
        if span.startswith(TOP_DIRS):
            out.append(span)
        elif re.fullmatch(r"[a-z_]+(/[a-z_]*)*(\.py)?", span) and (
            "/" in span or span.endswith(".py")
        ):
            out.append("swarmrl/" + span)
    return out


def test_every_path_the_map_names_exists():
    paths = map_paths(MAP.read_text())
    assert len(paths) > 40, "the map should name where things live"
    missing = sorted({p for p in paths if not (ROOT / p).exists()})
    assert not missing, "docs/architecture.md names paths that do not exist:\n" + "\n".join(missing)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def doc_pages() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(docs.glob("*.md")), *sorted(docs.glob("reference/*.md"))]


def test_relative_links_between_pages_resolve():
    broken = []
    for page in doc_pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if path and not path.endswith(".md"):
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                continue
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such page)")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_map_fits_on_a_few_screens_and_links_the_reference_pages():
    text = MAP.read_text()
    assert len(text.splitlines()) <= 320
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        assert f"reference/{page.name}" in text, f"the map does not link {page.name}"


def test_no_tracked_file_cites_outside_the_repository():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    needle = "../" + "shared/"  # split so this file does not cite it
    found = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for i, line in enumerate(text.splitlines(), 1):
            if needle in line:
                found.append(f"{name}:{i}: {line.strip()}")
    assert not found, "files citing paths outside the repository:\n" + "\n".join(found)
