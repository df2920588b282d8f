"""The command line of the scripts that compute one CSV from the committed run records (``verdicts.py``,
``recipe_table.py``, ``proxy_rank.py``, ...): write the CSV (through a temporary file, so a failed run leaves the old
one whole), or with ``--check`` exit 1 when the committed CSV differs from what the records give; :func:`csv_text`
is the text each of them writes."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable, Iterable
from pathlib import Path


def csv_text(columns: list[str], rows: Iterable[dict], **options: str) -> str:
    """The CSV text of ``rows`` under the header ``columns`` (``\\n`` line ends; ``options`` such as ``restval`` go
    to :class:`csv.DictWriter`)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", **options)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def csv_main(argv: list[str] | None, *, description: str, table: Callable[[Path], str], runs: Path, out: Path,
             what: str, script: str, written: Callable[[str], str]) -> int:
    """Parse ``--runs``, ``--out`` and ``--check``; ``table(runs)`` gives the CSV text, ``what`` names the file in
    ``--out``'s help and ``written(text)`` the count printed after writing it."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--runs", type=Path, default=runs, help="the kept run records (docs/results/runs)")
    p.add_argument("--out", type=Path, default=out, help=f"the {what} ({out.relative_to(out.parents[2])})")
    p.add_argument("--check", action="store_true", help="exit 1 when the CSV differs from what the records give")
    args = p.parse_args(argv)
    text = table(args.runs)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        if not same:
            print(f"{args.out} differs from the run records; run scripts/{script}", file=sys.stderr)
        return 0 if same else 1
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({written(text)})")
    return 0
