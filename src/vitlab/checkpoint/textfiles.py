"""The small text files a user hands vitlab (a checkpoint's ``config.json`` and ``manifest.json``, a study's
``sensitivity.csv``): read with limits on their size and nesting, every failure one line that names the file, the
line and the fix. Nothing here lets a malformed file end in a traceback (``csv.Error``, ``UnicodeDecodeError``
without the file's name, ``RecursionError`` from deeply nested JSON) or in reading gigabytes into memory."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitlab.errors import VitlabError

MAX_JSON_BYTES = 16 << 20  # a checkpoint's config.json is a few KB; a manifest lists three files
MAX_CSV_BYTES = 16 << 20  # a study's table holds a row per run: thousands of rows are under a megabyte
FIELD_LIMIT = csv.field_size_limit()  # the csv module's own (131,072 characters); never raised, so never global


def read_text(path: str | Path, *, name: str, fix: str, limit: int, error: type[VitlabError],
              encoding: str = "utf-8") -> str:
    """The text of ``path`` (at most ``limit`` bytes, ``encoding``); ``name`` is how messages call the file
    (``--lr-from FILE``), ``fix`` ends them, ``error`` is the class raised."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > limit:
            raise refusal(error, name, f"is {size:,} bytes, more than the {limit:,} bytes such a file can hold", fix)
        with p.open("rb") as fh:
            data = fh.read(limit + 1)  # a file that grows while it is read still stops at the limit
    except OSError as exc:
        raise refusal(error, name, f"cannot be read ({exc.strerror or exc})", fix) from None
    if len(data) > limit:
        raise refusal(error, name, f"is more than the {limit:,} bytes such a file can hold", fix)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise refusal(error, name, f"line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text (a binary or "
                      f"otherwise encoded file)", fix) from None


def read_json(path: str | Path, *, name: str | None = None, fix: str, error: type[VitlabError],
              limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in ``path`` (see :func:`read_text`); invalid or too deeply nested JSON is one line."""
    name = name or str(path)
    return parse_json(read_text(path, name=name, fix=fix, limit=limit, error=error), name=name, fix=fix, error=error)


def parse_json(text: str, *, name: str, fix: str, error: type[VitlabError]) -> Any:
    """``json.loads(text)``, its failures one ``error`` line naming ``name``, the line and ``fix``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise refusal(error, name, f"is not valid JSON (line {exc.lineno}: {exc.msg})", fix) from None
    except RecursionError:  # "[" * 1000: the decoder's recursion, not a ValueError
        raise refusal(error, name, "is not valid JSON for vitlab (nested more deeply than Python can read)",
                      fix) from None


def refusal(error: type[VitlabError], name: str, problem: str, fix: str) -> VitlabError:
    """``error("{name} {problem}; {fix}")``, its ``problem`` kept as an attribute for a caller that words its own
    message (the manifest's "is damaged")."""
    exc = error(f"{name} {problem}; {fix}")
    exc.problem = problem  # type: ignore[attr-defined]
    return exc


def read_csv(path: str | Path, *, name: str, fix: str, columns: Sequence[str], error: type[VitlabError],
             limit: int = MAX_CSV_BYTES) -> list[tuple[int, dict[str, str]]]:
    """The rows of the CSV table in ``path`` as ``(line, {column: text})``, ``line`` the 1-based line where the row
    starts (blank lines skipped). Refused in one line: a header that repeats a column or lacks one of ``columns``, a
    row with more or fewer fields than the header, a field over :data:`FIELD_LIMIT` characters, a file over
    ``limit`` bytes or not UTF-8 (a leading byte-order mark is allowed)."""
    text = read_text(path, name=name, fix=fix, limit=limit, error=error, encoding="utf-8-sig")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: list[tuple[int, dict[str, str]]] = []
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            line, start = start, reader.line_num + 1
            if not fields:
                continue
            if header is None:
                header = fields
                seen = [c for i, c in enumerate(header) if c in header[:i]]
                missing = [c for c in columns if c not in header]
                if seen or missing:
                    what = (f"repeats column {seen[0]!r}" if seen else
                            f"has no column {', '.join(map(repr, missing))}")
                    raise refusal(error, name, f"line {line}: the header {what}", fix)
                continue
            if len(fields) != len(header):
                raise refusal(error, name, f"line {line}: {len(fields)} fields where the header has {len(header)}", fix)
            rows.append((line, dict(zip(header, fields))))
    except csv.Error as exc:
        hint = f" (a field may hold at most {FIELD_LIMIT:,} characters)" if "field limit" in str(exc) else ""
        raise refusal(error, name, f"line {reader.line_num}: {exc}{hint}", fix) from None
    if header is None:
        raise refusal(error, name, "is empty, not a CSV table with a header", fix)
    return rows
