"""The files of every study and report folder: CSV and JSON written atomically (``write_csv``, ``write_json``,
``write_text``), read back (``read_csv``), the versions that made them (``versions``) and an offline ``index.html``
beside them (``write_report``, one :class:`Section` per part).

``write_report(out_dir, title, command, sections)`` embeds the PNGs by relative path, renders tables from
CSV files or row dicts, and states the exact command and the versions of python, torch, timm and vitlab,
so the folder can be copied anywhere and opened in a browser without a network.
"""

from __future__ import annotations

import csv
import html
import json
import math
import platform
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vitlab.atomic import atomic_path
from vitlab.errors import ConfigError

Rows = list[dict[str, Any]]


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    """JSON with NaN/inf written as null, so any browser or ``json`` parser reads it."""
    return write_text(path, json.dumps(_finite(data), indent=2, sort_keys=False) + "\n")


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_csv(path: str | Path, rows: Rows, columns: Sequence[str] | None = None) -> Path:
    """Write ``rows`` (dicts) as CSV; ``columns`` defaults to the keys of the first row."""
    if not rows and not columns:
        raise ConfigError(f"no rows to write to {path}; pass columns= for an empty table")
    cols = list(columns or rows[0].keys())
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols, extrasaction="raise")
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


def read_csv(path: str | Path) -> Rows:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def versions() -> dict[str, str]:
    """Versions that made a result: python, torch, timm, vitlab (plus numpy and matplotlib)."""
    import matplotlib
    import numpy
    import timm
    import torch

    from vitlab.version import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "timm": timm.__version__,
            "vitlab": __version__, "numpy": numpy.__version__, "matplotlib": matplotlib.__version__,
            "platform": platform.platform()}


@dataclass
class Section:
    """One part of a report: a heading, a paragraph, figures (PNG paths) and tables.

    ``figures`` are paths inside the report folder (relative to it, or absolute). Each table is a CSV
    path inside the folder (linked and rendered) or a list of row dicts (rendered only).
    """

    title: str
    text: str = ""
    figures: list[str | Path] = field(default_factory=list)
    tables: list[str | Path | Rows] = field(default_factory=list)


def _relative(out_dir: Path, p: str | Path) -> str:
    path = Path(p)
    full = path if path.is_absolute() else out_dir / path
    if not full.is_file():
        raise ConfigError(f"report file {full} does not exist; write it before calling write_report")
    try:
        return full.resolve().relative_to(out_dir.resolve()).as_posix()
    except ValueError:
        raise ConfigError(f"{full} is outside the report folder {out_dir}; save it under that folder so the "
                          "report opens offline") from None


def _cell(v: Any) -> str:
    if isinstance(v, str) and v.lower() in ("nan", ""):
        return ""
    if isinstance(v, float) or (isinstance(v, str) and _is_float(v)):
        x = float(v)
        if math.isnan(x):
            return ""
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.3e}"
        return f"{x:.4g}"
    return html.escape(str(v))


def _is_float(s: str) -> bool:
    if "." not in s and "e" not in s.lower():
        return False
    try:
        float(s)
    except ValueError:
        return False
    return True


def _table(rows: Rows, max_rows: int, source: str | None) -> str:
    out = []
    if source:
        out.append(f'<p class="src"><a href="{html.escape(source)}">{html.escape(source)}</a> '
                   f"({len(rows)} rows)</p>")
    if not rows:
        return "".join(out) + "<p><em>empty table</em></p>"
    cols = list(rows[0].keys())
    out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in cols) + "</tr></thead>")
    out.append("<tbody>")
    for r in rows[:max_rows]:
        out.append("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in cols) + "</tr>")
    out.append("</tbody></table>")
    if len(rows) > max_rows:
        out.append(f"<p><em>first {max_rows} of {len(rows)} rows; the file holds all of them</em></p>")
    return "".join(out)


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;border-radius:4px}
figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#666}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}th{background:#f6f8fa}
td:first-child,th:first-child{text-align:left}.src{font-size:.85em;margin-bottom:.2em}
"""


def write_report(out_dir: str | Path, title: str, command: str | Sequence[str],
                 sections: Sequence[Section | dict], *, max_rows: int = 60) -> Path:
    """Write ``out_dir/index.html`` and return its path.

    ``command`` is the exact command line (a string, or an argv list joined with shell quoting).
    ``sections`` are :class:`Section` s or dicts with the same keys. Tables longer than ``max_rows`` are
    cut in the page (the CSV keeps every row).
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ConfigError(f"report folder {out_dir} does not exist; write the figures and CSV files there first")
    cmd = command if isinstance(command, str) else shlex.join([str(c) for c in command])
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>{html.escape(title)}</h1>", f"<p>Written {stamp}.</p>",
            "<h2>Command</h2>", f"<pre>{html.escape(cmd)}</pre>"]
    for s in sections:
        sec = s if isinstance(s, Section) else Section(**s)
        body.append(f"<h2>{html.escape(sec.title)}</h2>")
        if sec.text:
            body += [f"<p>{html.escape(par)}</p>" for par in sec.text.split("\n\n") if par.strip()]
        for fig in sec.figures:
            rel = _relative(out_dir, fig)
            body.append(f'<figure><img src="{html.escape(rel)}" alt="{html.escape(rel)}">'
                        f"<figcaption>{html.escape(rel)}</figcaption></figure>")
        for tab in sec.tables:
            if isinstance(tab, (str, Path)):
                rel = _relative(out_dir, tab)
                body.append(_table(read_csv(out_dir / rel), max_rows, rel))
            else:
                body.append(_table(list(tab), max_rows, None))
    vers = versions()
    body.append("<h2>Versions</h2>")
    body.append(_table([{"package": k, "version": v} for k, v in vers.items()], len(vers), None))
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return write_text(out_dir / "index.html", page)
