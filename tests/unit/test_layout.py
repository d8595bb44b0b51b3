"""The package's import graph: no cycles, and no module imports another's private names.

Lazy imports inside functions count too: a cycle hidden in a function is still a cycle
in the design (two modules that need each other want the shared part moved below both).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "swarmrl"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _owner(name: str, mods: dict[str, Path]) -> str | None:
    """The module that defines `name` (a module, or an attribute of one)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """Edges module -> modules it imports, and the private names imported across modules."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
                names = []
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
                names = [(base, a.name) for a in node.names]
            else:
                continue
            for t in targets:
                owner = _owner(t, mods) if t.split(".")[0] == "swarmrl" else None
                if owner and owner != mod:
                    edges[mod].add(owner)
            for base, name in names:
                if (
                    base.startswith("swarmrl")
                    and name.startswith("_")
                    and not name.startswith("__")
                ):
                    if f"{base}.{name}" not in mods:
                        private.append(f"{mod} imports {base}.{name}")
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_graph_sees_imports():
    """The walker finds real edges, so an empty result below means something."""
    edges, _ = import_graph()
    assert "swarmrl.protocol.sampler" in edges["swarmrl.protocol.assign"]
    assert "swarmrl.protocol.seeds" in edges["swarmrl.protocol.sampler"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    edges, _ = import_graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_names_imported_across_modules():
    _, private = import_graph()
    assert not private, "private imports:\n" + "\n".join(private)
