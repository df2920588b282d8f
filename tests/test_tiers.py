"""The two test tiers: ``make test`` (the fast tier) still reaches every module of ``src/vitlab``, and ``make test-all``
(what CI runs, ``.ci/run``) adds the tests marked ``full``.

Coverage is read statically, from the tree as it is: the vitlab imports of every test file that holds at least one
test the fast tier runs (a test not marked full, slow, gpu or notebook, whole-file ``pytestmark`` included; the
imports inside the tests it leaves out do not count), of the helper modules those files import and of conftest.py;
then closed over the top-level imports of ``src/vitlab`` (a package's ``__init__`` runs before its modules). An import
inside a function counts only towards a module that no module imports at its top (lazy by design: the figures, which
need matplotlib, and the study modules the commands load). The CLI is modelled as ``vitlab.cli`` runs it:
``build_parser`` imports every command module and calls its ``register``, and a command's own imports (inside its
function, lazily) count when a test file that reaches the CLI names the command.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TESTS = ROOT / "tests"
OUT_OF_FAST = frozenset({"full", "slow", "gpu", "notebook"})  # the markers pyproject's addopts leave out


# ---------------------------------------------------------------------------------------------------------- src side
def src_modules(src: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under ``src/vitlab`` (a package by its ``__init__``)."""
    modules = {}
    for path in sorted((src / "vitlab").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: function bodies and ``if TYPE_CHECKING:`` left out."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            yield node
        elif isinstance(node, ast.If):
            yield from _top_level(node.orelse)
            if not _is_type_checking(node.test):
                yield from _top_level(node.body)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_level(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _top_level(node.body)


def _runnable(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (imports for type hints never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _imported(node: ast.stmt | ast.expr, package: str, modules: dict[str, Path]) -> set[str]:
    """The vitlab modules an import statement (or an ``import_module``/``importorskip`` call) loads, parents
    included; ``package`` resolves relative imports."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in ("import_module", "importorskip") and isinstance(node.args[0].value, str):
            names = [node.args[0].value]
    found = set()
    for name in names:
        parts = name.split(".")
        found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()
    return found


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports_in(nodes: Iterable[ast.AST], package: str, modules: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in nodes:
        for sub in _runnable(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom, ast.Call)):
                found |= _imported(sub, package, modules)
    return found


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def command_names(modules: dict[str, Path]) -> dict[str, set[str]]:
    """``vitlab.commands.X`` -> the sub-command names it registers (``add_parser("name", ...)``)."""
    names: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name.startswith("vitlab.commands.") and not name.rpartition(".")[2].startswith("_"):
            names[name] = {node.args[0].value for node in ast.walk(_parse(path))
                           if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                           and node.func.attr == "add_parser" and node.args and isinstance(node.args[0], ast.Constant)}
    return names


# --------------------------------------------------------------------------------------------------------- test side
def _marks(node: ast.expr) -> set[str]:
    """Marker names of ``pytest.mark.X``, ``pytest.mark.X(...)`` or a list/tuple of them (a ``pytestmark`` value or
    one decorator); marks inside ``pytest.param(..., marks=...)`` belong to one parameter and are not counted."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return set().union(*(_marks(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Call):
        node = node.func
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
            and isinstance(node.value.value, ast.Name) and node.value.value.id == "pytest"):
        return {node.attr}
    return set()


def _pytestmark(body: list[ast.stmt]) -> set[str]:
    marks: set[str] = set()
    for node in body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            marks |= _marks(node.value)
    return marks


@dataclass
class TierFile:
    """What the fast tier runs of one file under tests/: whether it runs any of its tests, the nodes it runs
    (the tests it leaves out removed) and the string constants in them."""

    path: Path
    fast_tests: int = 0
    kept: list[ast.AST] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> TierFile:
        tree = _parse(path)
        self = cls(path)
        if _pytestmark(tree.body) & OUT_OF_FAST:
            return self
        for node in tree.body:
            self._keep(node, in_class=False)
        return self

    def _keep(self, node: ast.stmt, in_class: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            marks = set().union(*(_marks(d) for d in node.decorator_list)) if node.decorator_list else set()
            if isinstance(node, ast.ClassDef):
                marks |= _pytestmark(node.body)
            if marks & OUT_OF_FAST:
                return
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for sub in node.body:
                    self._keep(sub, in_class=True)
                return
            self.fast_tests += node.name.startswith("test") and not isinstance(node, ast.ClassDef)
        self.kept.append(node)

    def strings(self) -> set[str]:
        return {n.value for node in self.kept for n in ast.walk(node)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    def runs_python_m_vitlab(self) -> bool:
        """A subprocess ``python -m vitlab ...`` (``"-m", "vitlab"`` side by side in a list or tuple)."""
        for node in self.kept:
            for n in ast.walk(node):
                if isinstance(n, (ast.List, ast.Tuple)):
                    values = [e.value if isinstance(e, ast.Constant) else None for e in n.elts]
                    if any(a == "-m" and b == "vitlab" for a, b in zip(values, values[1:])):
                        return True
        return False

    def local_imports(self, helpers: dict[str, Path]) -> set[str]:
        """The helper modules of tests/ (``_helpers``, ``_study``...) this file imports."""
        found = set()
        for node in self.kept:
            for n in ast.walk(node):
                if isinstance(n, ast.Import):
                    found |= {a.name for a in n.names} & helpers.keys()
                elif isinstance(n, ast.ImportFrom) and not n.level and n.module in helpers:
                    found.add(n.module)
        return found


@dataclass
class Coverage:
    """The vitlab modules the fast tier reaches, and by which test files."""

    reached: set[str]
    modules: dict[str, Path]
    fast_files: list[str]

    @property
    def missing(self) -> list[str]:
        return sorted(self.modules.keys() - self.reached)


def fast_tier_coverage(src: Path = SRC, tests: Path = TESTS) -> Coverage:
    modules = src_modules(src)
    helpers = {p.stem: p for p in tests.glob("*.py") if not p.name.startswith("test_")}
    files = [TierFile.read(p) for p in sorted(tests.glob("test_*.py"))]
    fast = [f for f in files if f.fast_tests]
    helper_files = {name: TierFile(path, kept=list(_parse(path).body)) for name, path in helpers.items()}

    def helper_closure(start: set[str]) -> set[str]:
        todo, seen = list(start), set(start)
        while todo:
            for name in helper_files[todo.pop()].local_imports(helpers) - seen:
                seen.add(name)
                todo.append(name)
        return seen

    def direct(f: TierFile) -> set[str]:
        return _imports_in(f.kept, "", modules)

    reached: set[str] = set()
    cli_strings: set[str] = set()
    for f in [*fast, *([helper_files["conftest"]] if "conftest" in helper_files else [])]:
        local = helper_closure(f.local_imports(helpers))
        imports = direct(f).union(*(direct(helper_files[h]) for h in local)) if local else direct(f)
        if f.runs_python_m_vitlab():
            imports |= {"vitlab.__main__"} & modules.keys()
        reached |= imports
        if imports & {"vitlab.cli", "vitlab.__main__"}:
            cli_strings |= f.strings()
    commands = command_names(modules)
    trees = {name: _parse(path) for name, path in modules.items()}
    top = {name: _imports_in(_top_level(tree.body), _package_of(name, modules[name]), modules)
           for name, tree in trees.items()}
    every = {name: _imports_in([tree], _package_of(name, modules[name]), modules) for name, tree in trees.items()}
    # imported only inside functions, nowhere at the top of a module (matplotlib's figures, the study modules the
    # commands load when they run): reached with a reached module that imports it
    lazy_only = modules.keys() - set().union(*top.values()) - commands.keys()
    registers = {name: _imports_in([n for n in trees[name].body if isinstance(n, ast.FunctionDef)
                                    and n.name == "register"], _package_of(name, modules[name]), modules)
                 for name in commands}

    todo, seen = list(reached), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        found = top[name] | {".".join(parts[:i]) for i in range(1, len(parts))}
        if name == "vitlab.cli":  # build_parser imports every command module (pkgutil) and calls its register()
            found |= commands.keys()
        if name in commands:
            found |= registers[name]
            if commands[name] & cli_strings:  # a test runs the command: its function's imports count
                found |= every[name]
        else:
            found |= every[name] & lazy_only
        todo.extend(found - seen)
    return Coverage(seen, modules, [f.path.name for f in fast])


def test_the_fast_tier_reaches_every_module_of_vitlab() -> None:
    coverage = fast_tier_coverage()
    assert len(coverage.fast_files) > 10 and len(coverage.modules) > 50, (coverage.fast_files, len(coverage.modules))
    assert not coverage.missing, (
        f"no test of the fast tier (make test) reaches these modules of src/vitlab, directly or through the imports "
        f"of the modules it reaches: {', '.join(coverage.missing)}; add a quick test that is not marked full, slow, "
        f"gpu or notebook")


def test_the_coverage_reading_sees_what_a_tier_leaves_out(tmp_path: Path) -> None:
    """A tree made up here: the closure follows top-level and relative imports, an import inside a function only to a
    module that nothing imports at the top, and a module only a `full` test imports (its whole file, its class or
    its function) is named as missing; every command module is reached with the CLI, the imports of its function
    only when a test that reaches the CLI names the command."""
    src, tests = tmp_path / "src", tmp_path / "tests"
    files = {
        "src/vitlab/__init__.py": "",
        "src/vitlab/a.py": "from . import b\n\ndef f():\n    import vitlab.lazy\n    from vitlab import figures\n",
        "src/vitlab/unreached.py": "import vitlab.lazy\n", "src/vitlab/figures.py": "",
        "src/vitlab/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vitlab.hinted\n",
        "src/vitlab/lazy.py": "", "src/vitlab/hinted.py": "", "src/vitlab/only_full.py": "",
        "src/vitlab/in_class.py": "", "src/vitlab/in_file.py": "", "src/vitlab/via_helper.py": "",
        "src/vitlab/cli.py": "from vitlab import commands\n", "src/vitlab/commands/__init__.py": "",
        "src/vitlab/commands/run.py": "def register(sub):\n    sub.add_parser('run-it')\n\n"
                                      "def go(args):\n    import vitlab.ran\n",
        "src/vitlab/commands/other.py": "def register(sub):\n    sub.add_parser('other')\n\n"
                                        "def go(args):\n    import vitlab.not_ran\n",
        "src/vitlab/ran.py": "", "src/vitlab/not_ran.py": "",
        "tests/_helpers.py": "import vitlab.via_helper\n\ndef cli(argv):\n    from vitlab.cli import main\n",
        "tests/test_fast.py": "import pytest\nfrom vitlab import a\nfrom _helpers import cli\n\n"
                              "def test_a():\n    cli(['run-it'])\n\n"
                              "@pytest.mark.full\ndef test_b():\n    import vitlab.only_full\n\n"
                              "class TestC:\n    pytestmark = [pytest.mark.slow]\n\n"
                              "    def test_c(self):\n        import vitlab.in_class\n",
        "tests/test_all_full.py": "import pytest\nimport vitlab.in_file\npytestmark = pytest.mark.full\n\n"
                                  "def test_d():\n    pass\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    coverage = fast_tier_coverage(src, tests)
    assert coverage.fast_files == ["test_fast.py"]
    assert coverage.missing == ["vitlab.hinted", "vitlab.in_class", "vitlab.in_file", "vitlab.lazy",
                                "vitlab.not_ran", "vitlab.only_full", "vitlab.unreached"]


# ----------------------------------------------------------------------------------------------- the tiers' commands
def _make_commands(target: str) -> list[str]:
    """The recipe lines of a Makefile target, ``$(VAR)`` expanded from the Makefile's assignments."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Za-z_]+)\s*[:?]?=\s*(.*)$", text, flags=re.M))
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)*)", text, flags=re.M)
    assert match, f"Makefile has no target {target}"
    lines = [line.strip() for line in match.group(1).splitlines()]
    for _ in range(5):
        lines = [re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), line) for line in lines]
    return lines


def _pytest_marker_expression(target: str) -> str:
    """The -m expression of the one pytest run of a make target (pyproject's addopts unless the recipe passes -m)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    runs = [shlex.split(line) for line in _make_commands(target) if re.search(r"\bpytest\b", line)]
    assert len(runs) == 1, f"make {target} should run pytest once: {runs}"
    addopts = shlex.split(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
                          ["addopts"])
    args = runs[0][next(i for i, word in enumerate(runs[0]) if word.endswith("pytest")) + 1:]
    argv = addopts + args  # the last -m wins, as in pytest
    assert "-n" in args, f"make {target} should run on the two cores (pytest-xdist -n 2): {runs[0]}"
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "-m"][-1]


def _selects(expression: str, markers: set[str]) -> bool:
    """Whether pytest's -m expression selects a test carrying ``markers``."""
    from _pytest.mark.expression import Expression

    return Expression.compile(expression).evaluate(lambda name, **_: name in markers)


def test_the_full_marker_is_registered_and_only_test_all_runs_it() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("full:") for m in markers), markers
    fast, everything = _pytest_marker_expression("test"), _pytest_marker_expression("test-all")
    assert _selects(fast, set()) and _selects(everything, set())
    for marker, in_test, in_test_all in [("full", False, True), ("notebook", False, True), ("slow", False, False),
                                         ("gpu", False, False)]:
        assert _selects(fast, {marker}) is in_test, (marker, fast)
        assert _selects(everything, {marker}) is in_test_all, (marker, everything)


def test_ci_runs_make_test_all() -> None:
    lines = [line.split("#")[0].split() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ["make", "test-all"] in lines
