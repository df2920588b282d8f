"""benchmarks/ holds only benchmarks, scripts/ the documentation pipeline and the experiments: every file of either
folder is named in the first column of the ``| file |`` table of the folder's README.md (a file added without a row
fails, and so does a row whose file is gone), and every result the benchmarks' index quotes exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"`([\w.-]+\.\w+)`")
RESULT = re.compile(r"`(results/[^`]+)`")


def _rows(readme: Path) -> list[list[str]]:
    """The cells of each row of the README's first table whose header starts with ``| file |``."""
    rows, inside = [], False
    for line in readme.read_text().splitlines():
        if line.startswith("| file |"):
            inside = True
        elif inside and line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif inside:
            break
    return rows


def unlisted(folder: Path) -> tuple[set[str], set[str]]:
    """(files of ``folder`` its README's table does not name, names in the table that are not files of ``folder``);
    README.md itself, hidden files and sub-folders (``results/``) are not counted."""
    files = {p.name for p in folder.iterdir() if p.is_file() and p.name != "README.md" and not p.name.startswith(".")}
    named = {name for row in _rows(folder / "README.md") for name in NAME.findall(row[0])}
    return files - named, named - files


def test_every_file_of_benchmarks_is_in_its_readmes_index() -> None:
    assert unlisted(ROOT / "benchmarks") == (set(), set())


def test_every_file_of_scripts_is_in_its_readme() -> None:
    assert unlisted(ROOT / "scripts") == (set(), set())


def test_a_file_added_without_a_row_or_a_row_without_its_file_fails(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# t\n\n| file | what |\n|---|---|\n| `a.py` with `a_part.py` | x |\n"
                                        "| `gone.sh` | y |\n\nAfter the table: `late.py`.\n")
    for name in ("a.py", "a_part.py", "new.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "results").mkdir()
    assert unlisted(tmp_path) == ({"new.py"}, {"gone.sh"})


def test_every_row_of_the_benchmarks_index_is_filled_and_its_results_exist() -> None:
    rows = _rows(ROOT / "benchmarks" / "README.md")
    assert rows and all(len(row) == 5 and all(row) for row in rows)  # file, measures, command, result, machine
    quoted = {path for row in rows for path in RESULT.findall(row[3])}
    assert quoted and all((ROOT / "benchmarks" / path).is_file() for path in quoted), quoted
