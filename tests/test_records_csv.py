"""``scripts/records_csv.py``: the CSV text and the command line every script that computes a CSV from the committed
run records shares (write through a temporary file; ``--check`` exits 1 when the committed CSV differs)."""

from __future__ import annotations

import csv
import io

from _scripts import load_script


def test_csv_text_writes_the_header_then_each_row_with_newline_line_ends():
    r = load_script("records_csv")
    text = r.csv_text(["arm", "depth", "note"], [{"arm": "vit", "depth": 6, "note": "a, b"}, {"arm": "cait",
                                                                                               "depth": 24}],
                      restval="")
    assert text == 'arm,depth,note\nvit,6,"a, b"\ncait,24,\n'
    assert list(csv.DictReader(io.StringIO(text)))[0] == {"arm": "vit", "depth": "6", "note": "a, b"}
    assert r.csv_text(["arm"], []) == "arm\n"  # a table of no rows is its header


def test_csv_main_writes_the_table_and_check_compares_it(tmp_path, capsys):
    r = load_script("records_csv")
    runs, out = tmp_path / "runs", tmp_path / "docs" / "results" / "t.csv"
    out.parent.mkdir(parents=True)
    text = "a\n1\n2\n"

    def main(*argv: str) -> int:
        return r.csv_main(["--runs", str(runs), "--out", str(out), *argv], description="t", table=lambda p: text,
                          runs=runs, out=out, what="test CSV", script="t.py",
                          written=lambda t: f"{t.count(chr(10)) - 1} rows")

    assert main("--check") == 1  # not written yet
    assert "differs from the run records; run scripts/t.py" in capsys.readouterr().err
    assert main() == 0
    assert out.read_text() == text and "(2 rows)" in capsys.readouterr().out
    assert not list(out.parent.glob("*.tmp"))  # written through a temporary file, which is gone
    assert main("--check") == 0
    out.write_text("a\n1\n")  # a hand edit
    assert main("--check") == 1
