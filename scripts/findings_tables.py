"""Keep docs/findings.md in step with the CSV files and figures it reports.

Every table of the page follows a marker comment naming its CSV (relative to ``docs/``) and one line per column,
``HEADER | TEMPLATE``; the template is text with ``{column}`` or ``{column:spec}`` fields of that CSV
(``spec``: Python's format spec), a field may be scaled, ``{memory_bytes/1048576:.1f}`` or ``{test_acc*100:.2f}``.
An optional ``where: column=value[, column!=value ...]`` line keeps the rows that meet every condition (a column
may have several, ``verdict!=undecided, verdict!=pending``)::

    <!-- table: results/complexity/fits.csv
    quantity | {label}
    exponent b (all sizes) | {exponent:.2f}
    -->
    | quantity | exponent b (all sizes) |
    | --- | ---: |
    | forward time | 1.39 |

Each figure follows ``<!-- figure: findings_NAME.png from STUDY/FILE.png | ALT TEXT -->`` (the image under
``docs/figures/`` and where it comes from in the study folder). A verdict word in the prose is generated too, from
``results/verdicts.csv``: ``<!-- verdict: ID[,ID ...] -->undecided<!-- /verdict -->`` holds the verdict of the
claims named (one word for several claims only while they share it; when they part, the check names the sentence
to rewrite), so a verdict that moves as the family grows moves in the sentence as well; ``<!-- family -->10 decided
of 59<!-- /family -->`` holds the family's size and its decided claims. Until its CSV or image
exists, the line after a marker says "Not yet run". A column whose values are all numbers is right-aligned; a cell
with an empty or NaN value reads ``n/a``.

    python scripts/findings_tables.py docs/findings.md                    # check: exit 1 and the differences
    python scripts/findings_tables.py docs/findings.md --write            # rewrite every table and figure line
    python scripts/findings_tables.py docs/findings.md --from-runs runs/findings --write
                                                      # first copy runs/findings/STUDY/FILE into docs/

``--from-runs`` copies ``runs/findings/STUDY/FILE.csv`` to ``docs/results/STUDY/FILE.csv`` for each table
marker and each figure marker's image to ``docs/figures/``; only CSV and PNG files move, never checkpoints.
``--keep-runs RUNS OUT`` copies the record of every finished run under ``RUNS/STUDY/RUN/`` (its ``summary.json``,
``config.json``, ``metrics.jsonl`` and a depth study's ``diagnostics.json``; never weights) to ``OUT/STUDY/RUN/``,
and ``--restore-runs OUT RUNS`` copies them back where a run folder is missing: a study invoked again reads a
restored run back as finished, so a study spread over several sessions (on machines that do not keep ``runs/``)
resumes from the committed records.
``--residual-cv IN OUT`` writes the coefficient of variation over blocks of a depth study's
``residual_ratios.csv`` (the uniformity of the residual ratios).
``--by-width OUT SUMMARY=WIDTH [SUMMARY=WIDTH ...]`` joins the ``summary.csv`` of depth studies run at different
embed_dim into one CSV (``OUT``, a column ``embed_dim``; the variants every study has, like for like) and draws
attention similarity and accuracy against depth per variant and width beside it (``OUT`` with ``.png``).

One script (about 500 lines): the page's table markers, their CSV readers and the joined tables they render
are one tool, run as one command.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import re
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"<!-- (table|figure): (.*?)-->\n", re.S)
VERDICT_SPAN = re.compile(r"<!-- verdict: ([^>]*?) -->(.*?)<!-- /verdict -->")
FAMILY_SPAN = re.compile(r"<!-- family -->(.*?)<!-- /family -->")
VERDICTS = ("results/verdicts.csv", "docs/results/verdicts.csv")  # from docs/findings.md, from README.md
FIELD = re.compile(r"\{(\w+)(?:([*/])([0-9.eE+-]+))?(?::([^}]*))?\}")
NA = "n/a"


@dataclass
class Block:
    """A marker and the generated lines after it: ``start:end`` spans those lines in the page."""

    kind: str  # table | figure
    spec: str
    start: int
    end: int


def blocks(text: str) -> list[Block]:
    """Every marker of ``text`` and the span of the block that follows it (its table, image or pending line)."""
    out = []
    for m in MARKER.finditer(text):
        start = end = m.end()
        lines = text[start:].split("\n")
        if lines and lines[0].startswith("|"):
            n = 0
            while n < len(lines) and lines[n].startswith("|"):
                n += 1
            end = start + sum(len(line) + 1 for line in lines[:n])
        elif lines and (lines[0].startswith("![") or lines[0].startswith("_Not yet run")):
            end = start + len(lines[0]) + 1
        out.append(Block(m.group(1), m.group(2), start, min(end, len(text))))
    return out


def _value(row: dict[str, str], name: str, op: str | None, factor: str | None, spec: str) -> str:
    if name not in row:
        raise KeyError(f"no column {name!r}; the CSV has {', '.join(row)}")
    raw = row[name]
    if not spec and not op:
        return raw if raw != "" else NA
    try:
        x = float(raw)
    except ValueError:
        return raw if raw != "" else NA
    if math.isnan(x):
        return NA
    if op:
        x = x * float(factor) if op == "*" else x / float(factor)
    if spec.endswith("d"):
        return format(int(round(x)), spec)
    return format(x, spec)


def fill(template: str, row: dict[str, str]) -> str:
    """``template`` with its fields from ``row``; a cell with any missing (empty or NaN) value reads ``n/a``."""
    values = [_value(row, m.group(1), m.group(2), m.group(3), m.group(4) or "") for m in FIELD.finditer(template)]
    if NA in values:
        return NA
    it = iter(values)
    return FIELD.sub(lambda _m: next(it), template)


def _numeric(rows: list[dict[str, str]], template: str) -> bool:
    m = FIELD.search(template)
    if not m:
        return False
    for r in rows:
        try:
            float(r.get(m.group(1), ""))
        except ValueError:
            return False
    return True


def table_source(spec: str) -> str:
    return spec.strip().split("\n")[0].strip()


def render_table(spec: str, docs: Path) -> str:
    """The markdown table (or the pending line) a table marker's spec gives for the CSV under ``docs``."""
    lines = [line.strip() for line in spec.strip().split("\n")]
    source, columns, where = lines[0], [], []
    for line in lines[1:]:
        if line.startswith("where:"):
            for cond in line[len("where:"):].split(","):
                key, _, value = cond.strip().partition("=")
                where.append((key.strip(), value.strip()))  # "column!" (column!=value): keep rows that differ
        elif line:
            header, sep, template = line.partition(" | ")
            if not sep:
                raise ValueError(f"column line {line!r} of the marker for {source} is not 'HEADER | TEMPLATE'")
            columns.append((header.strip(), template.strip()))
    path = docs / source
    if not path.exists():
        return f"_Not yet run: no docs/{source} yet; the command above writes it._\n"
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if all((r.get(k[:-1]) != v) if k.endswith("!") else (r.get(k) == v) for k, v in where)]
    if not rows:
        raise ValueError(f"docs/{source} has no row matching {where}")
    out = ["| " + " | ".join(h for h, _ in columns) + " |",
           "| " + " | ".join("---:" if _numeric(rows, t) else "---" for _, t in columns) + " |"]
    out += ["| " + " | ".join(fill(t, r) for _, t in columns) + " |" for r in rows]
    return "\n".join(out) + "\n"


def figure_parts(spec: str) -> tuple[str, str, str]:
    """``(image name, STUDY/FILE it comes from, alt text)`` of a figure marker."""
    head, _, alt = spec.strip().partition(" | ")
    name, _, source = head.partition(" from ")
    return name.strip(), source.strip(), alt.strip()


def render_figure(spec: str, docs: Path) -> str:
    name, source, alt = figure_parts(spec)
    if not (docs / "figures" / name).exists():
        return f"_Not yet run: docs/figures/{name} is copied from the study's {source}._\n"
    return f"![{alt}](figures/{name})\n"


def _verdict_rows(docs: Path) -> list[dict[str, str]]:
    """The rows of the verdicts CSV beside the page (none when there is none)."""
    for rel in VERDICTS:
        if (docs / rel).is_file():
            with (docs / rel).open(newline="") as f:
                return list(csv.DictReader(f))
    return []


def family_words(rows: list[dict[str, str]]) -> str:
    """What a ``<!-- family -->`` span holds: "R decided of M", the family's size (the claims with a q-value) and
    how many of them are decided, from the verdicts CSV's ``rows``."""
    tested = [r for r in rows if r.get("q", "") not in ("", "nan")]
    return f"{sum(r['verdict'] != 'undecided' for r in tested)} decided of {len(tested)}"


def verdict_word(ids: str, verdicts: dict[str, str]) -> str:
    """The verdict a ``<!-- verdict: IDS -->`` span holds: the one verdict every claim of ``ids`` has."""
    names = [i.strip() for i in ids.split(",") if i.strip()]
    unknown = [i for i in names if i not in verdicts]
    if not names or unknown:
        raise ValueError(f"no claim {', '.join(unknown) or repr(ids)} in verdicts.csv; name claims by its id column")
    words = {verdicts[i] for i in names}
    if len(words) > 1:
        said = "; ".join(f"{i} {verdicts[i]}" for i in names)
        raise ValueError(f"the claims {', '.join(names)} no longer share a verdict ({said}): rewrite the sentence "
                         "to give each its own span")
    return words.pop()


@dataclass
class Span:
    """A generated span of the prose: where it is, what it should hold, and what is wrong with it (if anything)."""

    match: re.Match
    line: int
    want: str | None
    problem: str | None


def spans(text: str, docs: Path) -> list[Span]:
    """Every verdict and family span of ``text`` with what the verdicts CSV beside the page says it should hold."""
    rows = _verdict_rows(docs)
    verdicts, family = {r["id"]: r["verdict"] for r in rows}, family_words(rows)
    out = []
    for m in VERDICT_SPAN.finditer(text):
        try:
            want, problem = verdict_word(m.group(1), verdicts), None
        except ValueError as e:
            want, problem = None, str(e)
        if want is not None and m.group(2) != want:
            problem = f"the verdict of {m.group(1)} is {want!r}, the page says {m.group(2)!r}"
        out.append(Span(m, text[:m.start()].count("\n") + 1, want, problem))
    for m in FAMILY_SPAN.finditer(text):
        problem = None if m.group(1) == family else f"the family is {family!r}, the page says {m.group(1)!r}"
        out.append(Span(m, text[:m.start()].count("\n") + 1, family, problem))
    return out


def update_spans(text: str, docs: Path) -> str:
    """``text`` with every span holding what it should; ValueError names a span that cannot hold one word."""
    found = spans(text, docs)
    for s in found:
        if s.want is None:
            raise ValueError(f"line {s.line}: {s.problem}")
    pieces, last = [], 0
    for s in sorted(found, key=lambda s: s.match.start()):
        start, end = s.match.span(s.match.re.groups)  # the span's inner text: its last group
        pieces += [text[last:start], s.want]
        last = end
    return "".join(pieces) + text[last:]


def render(block: Block, docs: Path) -> str:
    return render_table(block.spec, docs) if block.kind == "table" else render_figure(block.spec, docs)


def update(text: str, docs: Path) -> str:
    """``text`` with every generated block rewritten from the files under ``docs``."""
    pieces, last = [], 0
    for b in blocks(text):
        pieces += [text[last:b.start], render(b, docs)]
        last = b.end
    return "".join(pieces) + text[last:]


def differences(page: Path) -> list[str]:
    """One message per block of ``page`` that differs from what its CSV or figure gives."""
    text, docs = page.read_text(), page.parent
    out = []
    for b in blocks(text):
        want, have = render(b, docs), text[b.start:b.end]
        if want != have:
            where = text[:b.start].count("\n") + 1
            source = table_source(b.spec) if b.kind == "table" else figure_parts(b.spec)[0]
            out.append(f"{page}:{where}: the {b.kind} from {source} differs from the page\n"
                       f"--- page\n{have}--- expected\n{want}")
    out += [f"{page}:{s.line}: {s.problem}" for s in spans(text, docs) if s.problem]
    return out


def collect(page: Path, runs: Path) -> list[str]:
    """Copy each marker's CSV and figure from the study folders under ``runs``; returns what was copied."""
    docs, copied = page.parent, []
    for b in blocks(page.read_text()):
        if b.kind == "table":
            source = table_source(b.spec)
            src, dst = runs / Path(source).relative_to("results"), docs / source
        else:
            name, origin, _ = figure_parts(b.spec)
            src, dst = runs / origin, docs / "figures" / name
        if src.suffix not in (".csv", ".png"):
            raise ValueError(f"{src}: only CSV and PNG files are copied into docs/")
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            copied.append(str(dst))
    return copied


RUN_RECORD = ("summary.json", "config.json", "metrics.jsonl", "diagnostics.json",
              "test_predictions.json")  # what a study reads back, and the per-image record for paired tests


def keep_runs(runs: Path, out: Path) -> list[str]:
    """Copy the record (:data:`RUN_RECORD`, never weights) of each finished run ``runs/STUDY/RUN`` to
    ``out/STUDY/RUN``; returns the run folders kept."""
    kept = []
    for summary in sorted(runs.glob("*/*/summary.json")):
        run = summary.parent
        dst = out / run.relative_to(runs)
        dst.mkdir(parents=True, exist_ok=True)
        for name in RUN_RECORD:
            if (run / name).is_file():
                shutil.copyfile(run / name, dst / name)
        kept.append(str(dst))
    return kept


def restore_runs(out: Path, runs: Path) -> list[str]:
    """Copy each kept run record under ``out`` back to ``runs/STUDY/RUN`` where that folder does not exist (a run
    trained since is never overwritten); returns the run folders restored."""
    restored = []
    for summary in sorted(out.glob("*/*/summary.json")):
        dst = runs / summary.parent.relative_to(out)
        if dst.exists():
            continue
        shutil.copytree(summary.parent, dst)
        restored.append(str(dst))
    return restored


def residual_cv(src: Path, dst: Path) -> None:
    """Coefficient of variation (population std / mean) over the self-attention blocks of each run of a depth
    study's ``residual_ratios.csv``, per branch (attn, mlp), then its mean and std over seeds per variant and
    depth: 0 when every block adds the same share to the residual stream."""
    with src.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "self_attention"]
    per_run: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        run = per_run.setdefault((r["variant"], int(r["depth"]), int(r["seed"])), {"attn": [], "mlp": []})
        for branch in run:
            run[branch].append(float(r[f"{branch}_mean"]))
    groups: dict[tuple, dict[str, list[float]]] = {}
    for (variant, depth, _seed), branches in per_run.items():
        group = groups.setdefault((variant, depth), {"attn": [], "mlp": []})
        for branch, ratios in branches.items():
            mean = statistics.fmean(ratios)
            group[branch].append(statistics.pstdev(ratios) / mean if mean > 0 else float("nan"))
    order = list(dict.fromkeys(r["variant"] for r in rows))
    table = []
    for (variant, depth), g in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        stats: list[float] = []
        for branch in ("attn", "mlp"):
            cvs = [c for c in g[branch] if math.isfinite(c)]  # a branch whose ratios are all 0 has no CV
            stats += [statistics.fmean(cvs) if cvs else math.nan,
                      statistics.stdev(cvs) if len(cvs) > 1 else (0.0 if cvs else math.nan)]
        table.append([variant, depth, len(g["attn"]), *stats])
    header = ["variant", "depth", "seeds", "cv_attn_mean", "cv_attn_std", "cv_mlp_mean", "cv_mlp_std"]
    _write_csv(dst, header, [dict(zip(header, row)) for row in table])


def _write_csv(dst: Path, fields: list[str], rows: list[dict]) -> None:
    """``rows`` (columns ``fields``, others ignored, missing ones empty) to ``dst`` through a temporary file, so
    an interrupted write never leaves a half-written CSV."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", restval="")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(dst)


BY_WIDTH_COLUMNS = ("n", "test_acc_median", "test_acc_mean", "test_acc_std", "mean_similarity_mean",
                    "mean_similarity_std", "similar_fraction_mean", "mean_similar_blocks_mean",
                    "mean_similarity_pre_mix_mean", "mean_similarity_pre_mix_std", "similar_fraction_pre_mix_mean",
                    "mean_similar_blocks_pre_mix_mean", "attn_entropy_mean", "undertrained", "diverged")


def _finite(value: str) -> float | None:
    try:
        x = float(value)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def by_width(out: Path, sources: list[tuple[Path, int]]) -> list[dict[str, str]]:
    """Join depth-study summaries run at the embed_dims of ``sources`` (``(summary.csv, width)``) into ``out``,
    keeping the variants that every study has, and draw ``out`` with ``.png``; returns the joined rows."""
    tables = []
    for src, width in sources:
        with src.open(newline="") as f:
            tables.append([{**r, "embed_dim": str(width)} for r in csv.DictReader(f)])
    common = set.intersection(*({r["variant"] for r in t} for t in tables))
    if not common:
        raise ValueError("the depth studies share no variant, so there is nothing to compare like for like")
    order = list(dict.fromkeys(r["variant"] for t in tables for r in t if r["variant"] in common))
    rows = sorted((r for t in tables for r in t if r["variant"] in common),
                  key=lambda r: (order.index(r["variant"]), int(r["embed_dim"]), int(r["depth"])))
    _write_csv(out, ["variant", "embed_dim", "depth", *BY_WIDTH_COLUMNS], rows)
    _draw_by_width(rows, out.with_suffix(".png"))
    return rows


def _accuracy(row: dict[str, str]) -> float:
    """A joined row's test accuracy over seeds: the median, or the mean in a summary written before medians."""
    median = _finite(row.get("test_acc_median", ""))
    return median if median is not None else float(row["test_acc_mean"])


def _draw_by_width(rows: list[dict[str, str]], png: Path) -> None:
    from vitlab.plots.figure import new_figure, save

    widths = sorted({int(r["embed_dim"]) for r in rows})
    styles = dict(zip(widths, ("-", "--", ":", "-.")))
    fig = new_figure(15, 4)
    sim, ent, acc = fig.subplots(1, 3)
    colours = (f"C{i % 10}" for i in itertools.count())
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for column, label in (("mean_similarity_mean", ""), ("mean_similarity_pre_mix_mean", " before the mix")):
            mine = [r for r in rows if r["variant"] == variant and _finite(r.get(column, "")) is not None]
            if not mine:
                continue
            colour = next(colours)
            for width in widths:
                pts = sorted((int(r["depth"]), _finite(r[column])) for r in mine if int(r["embed_dim"]) == width)
                if pts:
                    sim.plot(*zip(*pts), styles[width], marker="o", color=colour,
                             label=f"{variant}{label}, width {width}")
                if not label:
                    mine_w = [r for r in rows if r["variant"] == variant and int(r["embed_dim"]) == width]
                    pts = sorted((int(r["depth"]), 100 * _accuracy(r)) for r in mine_w)
                    acc.plot(*zip(*pts), styles[width], marker="o", color=colour, label=f"{variant}, width {width}")
                    pts = sorted((int(r["depth"]), _finite(r.get("attn_entropy_mean", ""))) for r in mine_w
                                 if _finite(r.get("attn_entropy_mean", "")) is not None)
                    if pts:
                        ent.plot(*zip(*pts), styles[width], marker="o", color=colour,
                                 label=f"{variant}, width {width}")
    sim.axhline(0.9, color="grey", lw=0.8, ls=":")
    sim.set(xlabel="depth (blocks)", ylabel="mean cross-layer cosine similarity",
            title="attention similarity against depth and width")
    ent.set(xlabel="depth (blocks)", ylabel="normalised entropy (1 = uniform)", ylim=(0, 1.05),
            title="entropy of the softmax maps (before any mix)")
    acc.set(xlabel="depth (blocks)", ylabel="test accuracy (%)", title="accuracy (median over seeds)")
    for ax in (sim, ent, acc):
        ax.set_xticks(sorted({int(r["depth"]) for r in rows}))
        if ax.get_legend_handles_labels()[0]:  # the entropy panel is empty for older studies
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    save(fig, png)


def _width_source(text: str) -> tuple[Path, int]:
    path, sep, width = text.rpartition("=")
    if not sep or not width.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give SUMMARY=WIDTH, e.g. runs/findings/depth/summary.csv=64")
    return Path(path), int(width)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Check or rewrite the tables and figures of docs/findings.md from "
                                            "docs/results/**.csv and docs/figures/findings_*.png.")
    p.add_argument("page", type=Path, nargs="?", default=Path("docs/findings.md"))
    p.add_argument("--write", action="store_true", help="rewrite the page instead of checking it")
    p.add_argument("--from-runs", type=Path, metavar="DIR",
                   help="first copy each table's CSV and each figure from the study folders under DIR")
    p.add_argument("--residual-cv", nargs=2, type=Path, metavar=("IN", "OUT"),
                   help="write the per-block coefficient of variation of IN (residual_ratios.csv) to OUT, then go on")
    p.add_argument("--by-width", nargs="+", metavar="OUT SUMMARY=WIDTH",
                   help="join depth-study summaries run at other embed_dims into OUT (and OUT as .png), then go on")
    p.add_argument("--keep-runs", nargs=2, type=Path, metavar=("RUNS", "OUT"),
                   help="copy each finished run's record (summary, config, metrics; never weights) under RUNS to OUT")
    p.add_argument("--restore-runs", nargs=2, type=Path, metavar=("OUT", "RUNS"),
                   help="copy the run records kept in OUT back under RUNS where a run folder is missing, then stop")
    args = p.parse_args(argv)
    if args.restore_runs:
        restored = restore_runs(*args.restore_runs)
        print(f"restored {len(restored)} runs into {args.restore_runs[1]}")
        return 0
    if args.keep_runs:
        print(f"kept the records of {len(keep_runs(*args.keep_runs))} runs in {args.keep_runs[1]}")
    if not args.page.exists():
        print(f"findings_tables: {args.page} does not exist; pass the page, e.g. docs/findings.md", file=sys.stderr)
        return 2
    if args.residual_cv:
        residual_cv(*args.residual_cv)
    if args.by_width:
        if len(args.by_width) < 3:
            p.error("--by-width needs OUT and at least two SUMMARY=WIDTH")
        try:
            sources = [_width_source(t) for t in args.by_width[1:]]
        except argparse.ArgumentTypeError as e:
            p.error(str(e))
        missing = [str(src) for src, _ in sources if not src.is_file()]
        if missing:
            print(f"findings_tables: {', '.join(missing)} not found; run those depth studies first "
                  "(or pass their summary.csv)", file=sys.stderr)
            return 2
        try:
            rows = by_width(Path(args.by_width[0]), sources)
        except ValueError as e:
            print(f"findings_tables: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.by_width[0]} ({len(rows)} rows) and its .png")
    if args.from_runs:
        for path in collect(args.page, args.from_runs):
            print(f"copied {path}")
    if args.write:
        text = args.page.read_text()
        try:
            new = update_spans(update(text, args.page.parent), args.page.parent)
        except ValueError as e:  # nothing written: the page stays as it was
            print(f"findings_tables: {args.page}: {e}", file=sys.stderr)
            return 2
        if new != text:
            args.page.write_text(new)
        print(f"{args.page}: {len(blocks(new))} blocks and {len(VERDICT_SPAN.findall(new))} verdict words up to date")
        return 0
    diffs = differences(args.page)
    for d in diffs:
        print(d)
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
