"""The import graph of ``src/vitlab`` (read with ``ast``, imports inside functions included) has no circle and
every arrow points down the layering README's "Development" section draws."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "vitlab"

# rank of each top-level part: a module may import its own part and parts of a lower or equal rank, never higher
LAYERS: dict[str, int] = {
    "errors": 0, "atomic": 0, "version": 0, "slice_rng": 0, "catalog": 0,
    "layers": 1,
    "models": 2,
    "flops": 3, "analysis": 3, "plots": 3, "writers": 3, "data": 3, "perf": 3, "checkpoint": 3, "provenance": 3,
    "outputs": 3,
    "interop": 4,
    "train": 5, "inference": 5,
    "experiments": 6,
    "commands": 7, "cli": 7, "__main__": 7,
    "": 8,  # the package root (vitlab/__init__.py): the public facade, imported by nothing inside
}


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """module -> the vitlab modules it imports (``from vitlab.x import name`` counts as ``vitlab.x.name`` when
    that is a module, else as ``vitlab.x``)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t == "vitlab" or t.startswith("vitlab.")}
        edges.discard(name)
        graph[name] = {e if e in files else e.rpartition(".")[0] for e in edges}
    return graph


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in graph.items():
        for dst in targets:
            a, b = part(src), part(dst)
            if a not in LAYERS or b not in LAYERS:
                bad.append(f"{src} -> {dst}: {a or b} has no place in LAYERS")
            elif a != b and LAYERS[b] > LAYERS[a]:
                bad.append(f"{src} -> {dst}")
    return sorted(bad)


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_imports_point_down_the_layering() -> None:
    assert upward(import_graph()) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "vitlab"
    for rel, text in files.items():
        p = pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return pkg


def test_a_new_circle_is_caught(tmp_path: Path) -> None:
    pkg = _write(tmp_path, {"__init__.py": "", "layers/__init__.py": "", "perf.py": "def f():\n    from vitlab.layers"
                            ".a import x\n", "layers/a.py": "from vitlab.perf import f\nx = 1\n"})
    graph = import_graph(pkg)
    assert cycles(graph) == [["vitlab.layers.a", "vitlab.perf"]]
    assert upward(graph) == ["vitlab.layers.a -> vitlab.perf"]


@pytest.mark.parametrize("line", ["from vitlab import __version__", "import vitlab", "from vitlab.train import x"])
def test_an_upward_arrow_is_caught(tmp_path: Path, line: str) -> None:
    files = {"__init__.py": "", "train/__init__.py": "x = 1\n", "models/m.py": f"def g():\n    {line}\n"}
    pkg = _write(tmp_path, files)
    assert upward(import_graph(pkg)) != []
