"""docs/findings.md cannot drift from what was measured: each table equals its CSV, each link exists."""

from __future__ import annotations

import csv
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "findings.md"
SCRIPT = ROOT / "scripts" / "findings_tables.py"
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def _tables():
    return load_script("findings_tables")


def _copy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    return docs / "findings.md"


def _write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_every_table_matches_its_csv() -> None:
    assert _tables().differences(PAGE) == []


def test_every_table_has_a_marker() -> None:
    """A markdown table outside a generated block would be a number no test checks."""
    text = PAGE.read_text()
    generated = [(b.start, b.end) for b in _tables().blocks(text)]
    offset = 0
    for line in text.split("\n"):
        if line.startswith("|"):
            assert any(s <= offset < e for s, e in generated), f"table line without a marker: {line}"
        offset += len(line) + 1


def test_every_linked_file_exists() -> None:
    text = PAGE.read_text()
    links = [t for t in LINK.findall(text) if "://" not in t]
    assert any(t.startswith("figures/") for t in links) and any(t.startswith("results") for t in links)
    missing = [t for t in links if not (PAGE.parent / t).exists()]
    assert missing == []
    for b in _tables().blocks(text):  # a table shown is a CSV that exists; a figure marker's image likewise
        if b.kind == "table" and text[b.start:b.end].startswith("|"):
            assert (PAGE.parent / _tables().table_source(b.spec)).exists()


def test_measured_sections_are_filled() -> None:
    """The complexity study was run: its tables and figure are on the page, not "Not yet run"."""
    text = PAGE.read_text()
    for b in _tables().blocks(text):
        source = _tables().table_source(b.spec) if b.kind == "table" else b.spec
        if "complexity" in source:
            assert not text[b.start:b.end].startswith("_Not yet run"), source


def test_an_edited_number_fails(tmp_path: Path) -> None:
    page = _copy_docs(tmp_path)
    text = page.read_text()
    row = "| 224 | 1025 | "
    assert row in text
    page.write_text(text.replace(row, "| 224 | 1024 | ", 1))
    diffs = _tables().differences(page)
    assert len(diffs) == 1 and "results/complexity/complexity.csv" in diffs[0]
    check = subprocess.run([sys.executable, str(SCRIPT), str(page)], capture_output=True, text=True)
    assert check.returncode == 1 and "differs from the page" in check.stdout
    write = subprocess.run([sys.executable, str(SCRIPT), str(page), "--write"], capture_output=True, text=True)
    assert write.returncode == 0 and page.read_text() == text


def test_an_edited_csv_fails(tmp_path: Path) -> None:
    page = _copy_docs(tmp_path)
    fits = page.parent / "results" / "complexity" / "fits.csv"
    fits.write_text(fits.read_text().replace("1.9999999999999991", "2.5", 1))
    diffs = _tables().differences(page)
    assert len(diffs) == 1 and "| attention MACs | 2.50 |" in diffs[0]


def test_pending_table_fills_from_its_csv(tmp_path: Path) -> None:
    t = _tables()
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "page.md"
    page.write_text("intro\n\n<!-- table: results/s/summary.csv\nwidth | {embed_dim}\n"
                    "acc (%) | {acc*100:.1f} ± {std*100:.1f}\nmemory | {bytes/1048576:.1f} MiB\nwhere: keep=yes\n-->\n"
                    "_Not yet run: no docs/results/s/summary.csv yet; the command above writes it._\n\nafter\n"
                    "<!-- figure: findings_s.png from s/s.png | the s figure -->\n"
                    "_Not yet run: docs/figures/findings_s.png is copied from the study's s/s.png._\n")
    assert t.differences(page) == []
    runs = tmp_path / "runs"
    _write_csv(runs / "s" / "summary.csv", [
        {"embed_dim": "32", "acc": "0.5", "std": "0.01", "bytes": "2097152", "keep": "yes"},
        {"embed_dim": "64", "acc": "0.9", "std": "nan", "bytes": "1048576", "keep": "yes"},
        {"embed_dim": "128", "acc": "0.1", "std": "0", "bytes": "0", "keep": "no"}])
    (runs / "s" / "s.png").write_bytes(b"\x89PNG")
    (runs / "s" / "model.safetensors").write_bytes(b"weights")
    assert sorted(Path(p).name for p in t.collect(page, runs)) == ["findings_s.png", "summary.csv"]
    assert not (docs / "results" / "s" / "model.safetensors").exists()
    assert len(t.differences(page)) == 2
    page.write_text(t.update(page.read_text(), docs))
    text = page.read_text()
    assert ("| width | acc (%) | memory |\n| ---: | ---: | ---: |\n| 32 | 50.0 ± 1.0 | 2.0 MiB |\n"
            "| 64 | n/a | 1.0 MiB |\n\nafter\n") in text
    assert "![the s figure](figures/findings_s.png)\n" in text
    assert t.differences(page) == [] and t.update(text, docs) == text


def test_unknown_column_names_the_csv_columns(tmp_path: Path) -> None:
    t = _tables()
    _write_csv(tmp_path / "results" / "a.csv", [{"x": "1"}])
    with pytest.raises(KeyError, match="no column 'y'; the CSV has x"):
        t.render_table("results/a.csv\nY | {y}\n", tmp_path)


def test_residual_cv(tmp_path: Path) -> None:
    rows = []
    for seed, attn in ((0, (1.0, 3.0)), (1, (2.0, 2.0))):
        for block, a in enumerate(attn):
            rows.append({"variant": "vit", "depth": 2, "seed": seed, "block": block, "kind": "self_attention",
                         "attn_mean": a, "attn_std": 0, "mlp_mean": 0.0, "mlp_std": 0})
    rows.append({"variant": "vit", "depth": 2, "seed": 0, "block": 2, "kind": "class_attention",
                 "attn_mean": 100.0, "attn_std": 0, "mlp_mean": 1.0, "mlp_std": 0})
    src, dst = tmp_path / "residual_ratios.csv", tmp_path / "out" / "cv.csv"
    _write_csv(src, rows)
    _tables().residual_cv(src, dst)
    with dst.open() as f:
        (row,) = list(csv.DictReader(f))
    # seed 0: std 1 / mean 2 = 0.5; seed 1: 0; class attention left out; MLP ratios all 0: no CV
    assert float(row["cv_attn_mean"]) == pytest.approx(0.25)
    assert float(row["cv_attn_std"]) == pytest.approx(0.125 ** 0.5)  # sample std of 0.5 and 0
    assert row["seeds"] == "2" and row["cv_mlp_mean"] == "nan"


def test_by_width_joins_like_for_like(tmp_path: Path, capsys) -> None:
    def summary(path: Path, variants: tuple[str, ...], sim: float) -> Path:
        _write_csv(path, [{"variant": v, "depth": d, "n": 2, "test_acc_mean": 0.97, "test_acc_std": 0.01,
                           **({"test_acc_median": 0.96 + d / 1000} if sim < 0.35 else {}),
                           "mean_similarity_mean": sim + d / 100, "mean_similarity_std": 0.0,
                           "mean_similarity_pre_mix_mean": "nan" if v == "vit" else 0.95}
                          for v in variants for d in (12, 6)])
        return path

    narrow = summary(tmp_path / "d64" / "summary.csv", ("vit", "layerscale", "deepvit"), 0.4)
    wide = summary(tmp_path / "d128" / "summary.csv", ("deepvit", "vit"), 0.3)
    out = tmp_path / "width" / "by_width.csv"
    t = _tables()
    assert t.main([str(tmp_path / "none.md"), "--by-width", str(out), f"{narrow}=64", f"{wide}=128"]) == 2
    page = tmp_path / "page.md"
    page.write_text("no tables\n")
    assert t.main([str(page), "--by-width", str(out), f"{narrow}=64", f"{wide}=128"]) == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    # layerscale has no width-128 study: left out; ordered by variant, width, depth
    assert [(r["variant"], r["embed_dim"], r["depth"]) for r in rows] == [
        ("vit", "64", "6"), ("vit", "64", "12"), ("vit", "128", "6"), ("vit", "128", "12"),
        ("deepvit", "64", "6"), ("deepvit", "64", "12"), ("deepvit", "128", "6"), ("deepvit", "128", "12")]
    assert float(rows[3]["mean_similarity_mean"]) == pytest.approx(0.42)
    # the median over seeds is carried where the study wrote it (width 128 here), and drawn in preference to the mean
    assert [r["test_acc_median"] for r in rows[:4]] == ["", "", "0.966", "0.972"]
    assert [t._accuracy(r) for r in rows[:4]] == pytest.approx([0.97, 0.97, 0.966, 0.972])
    assert out.with_suffix(".png").stat().st_size > 0 and not list(out.parent.glob("*.tmp*"))
    assert t.main([str(page), "--by-width", str(out), f"{narrow}=64", str(tmp_path / "missing.csv") + "=128"]) == 2
    assert "missing.csv not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        t.main([str(page), "--by-width", str(out), f"{narrow}=64", f"{wide}=wide"])


def test_pending_markers_name_columns_the_studies_write() -> None:
    """A table not yet filled must still name columns its study's summary.csv will have."""
    from vitlab.experiments import depth_study, sweep
    from vitlab.experiments.table import value_columns

    def agg(values: tuple[str, ...]) -> set[str]:
        return {f"{v}_{s}" for v in values for s in ("mean", "std", "median")} | {"n", "params", "macs", "undertrained",
                                                                          "diverged"}

    t = _tables()
    text = PAGE.read_text()
    checked = 0
    for b in t.blocks(text):
        if b.kind != "table":
            continue
        source = t.table_source(b.spec)
        study = Path(source).parts[1]
        fields = {m.group(1) for m in t.FIELD.finditer(b.spec)}
        if source.endswith("by_width.csv"):  # findings_tables --by-width writes it
            assert fields <= {"variant", "embed_dim", "depth", *t.BY_WIDTH_COLUMNS}, fields
            checked += 1
            continue
        if not source.endswith("summary.csv") or study == "table1":
            continue
        if study.startswith("depth"):  # a study on a validation split also writes the validation columns
            known = agg(value_columns(depth_study.VALUES, validation=True)) | {"variant", "depth"}
        else:  # a sweep on a validation split (--val-split) writes them too
            known = agg(value_columns(sweep.VALUES, validation=True)) | set(sweep.param_types("vit_mnist"))
        assert fields <= known, (source, fields - known)
        checked += 1
    assert checked >= 12


def test_kept_run_records_resume_a_study_in_another_session(tmp_path: Path) -> None:
    """A run's record (never its weights) kept in docs/results and restored on a fresh machine is read back by the
    same sweep as finished, so a study spread over sessions resumes; a run present is never overwritten."""
    from vitlab.cli import main as vitlab

    runs, kept = tmp_path / "runs", tmp_path / "kept"
    cmd = ["sweep", "--model", "vit_mnist", "--dataset", "mnist-5k", "--param", "depth", "--values", "1",
           "--epochs", "1", "--limit-train", "64", "--limit-test", "64", "--threads", "1", "--no-progress",
           "--output", str(runs / "sweep_depth")]
    assert vitlab(cmd) == 0
    run = runs / "sweep_depth" / "depth=1_seed=0"
    assert (run / "model.safetensors").is_file()
    assert len(_tables().keep_runs(runs, kept)) == 1
    record = kept / "sweep_depth" / "depth=1_seed=0"
    assert sorted(p.name for p in record.iterdir()) == ["config.json", "metrics.jsonl", "summary.json",
                                                        "test_predictions.json"]
    shutil.rmtree(runs)  # the next session's machine: no runs/, only the committed records
    assert _tables().restore_runs(kept, runs) == [str(run)]
    assert _tables().restore_runs(kept, runs) == []  # present now: left alone
    before = (run / "summary.json").read_text()
    assert vitlab(cmd) == 0
    assert not (run / "model.safetensors").exists()  # read back, not trained again
    assert (run / "summary.json").read_text() == before
    assert (runs / "sweep_depth" / "summary.csv").is_file()


# ------------------------------------------------------------------------------------------------ verdicts

VERDICT_WORD = re.compile(r"\b(not reproduced|reproduced|contradicted|undecided|not decided|none decided)\b", re.I)
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)[. ]")
BULLET = re.compile(r"^- \*\*(\d+\.\d+) ")


def _verdict_rows() -> list[dict[str, str]]:
    with (ROOT / "docs" / "results" / "verdicts.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_verdicts_csv_is_computed_from_the_run_records() -> None:
    """Recomputed from docs/results/runs in the test (seconds: t-tests over runs): a hand edit of verdicts.csv fails
    here."""
    assert load_script("verdicts").table() == (ROOT / "docs" / "results" / "verdicts.csv").read_text()


def test_every_verdict_follows_the_rule() -> None:
    """Each row's verdict is the family rule on its own cells: q <= 0.05 decides (by the effect's sign for a
    difference), the adjusted interval agrees with it, and the seed is the unit (no per-image test decides)."""
    stats = pytest.importorskip("vitlab.experiments.stats")
    rows = _verdict_rows()
    assert {"section", "claim", "comparison", "effect", "ci_low", "ci_high", "p", "q", "adj_ci_low", "adj_ci_high",
            "seeds", "mde", "verdict", "test"} <= set(rows[0])
    qs = [float(r["q"]) for r in rows if not math.isnan(float(r["q"]))]
    decided = sum(q <= 0.05 for q in qs)
    for r in rows:
        assert "image" not in r["test"] and "McNemar" not in r["test"], r["id"]
        if r["verdict"] == "pending":  # section 10: an arm short of the runs its design plans, nothing computed
            assert r["section"] == "10" and r["test"].startswith("pending"), r["id"]
            assert all(math.isnan(float(r[k])) for k in ("effect", "ci_low", "p", "q")), r["id"]
            continue
        lo, hi = float(r["ci_low"]), float(r["ci_high"])
        if math.isnan(lo) or math.isnan(hi):  # an arm with one run so far: no interval, so no verdict yet
            assert r["verdict"] == stats.UNDECIDED and {"0", "1"} & set(r["seeds"].split("/")), r["id"]
            assert r["runs_to_decide"], r["id"]
            continue
        assert lo <= float(r["effect"]) <= hi, r["id"]
        q, alo, ahi = float(r["q"]), float(r["adj_ci_low"]), float(r["adj_ci_high"])
        assert alo <= lo and hi <= ahi, r["id"]  # the family's interval is the wider one
        m = float(r["margin"] or 0)
        if r["margin"] and "non-inferiority" in r["test"]:
            want = stats.REPRODUCED if q <= 0.05 else stats.CONTRADICTED if ahi + m < 0 else stats.UNDECIDED
            if q <= 0.05:
                assert alo + m > 0, r["id"]
        elif r["margin"]:  # equivalence: TOST, never the difference rule
            assert "TOST" in r["test"], r["id"]
            want = stats.REPRODUCED if q <= 0.05 else (
                stats.CONTRADICTED if alo >= m or ahi <= -m else stats.UNDECIDED)
        else:
            want = stats.UNDECIDED if q > 0.05 else stats.REPRODUCED if float(r["effect"]) > 0 else stats.CONTRADICTED
            assert (q <= 0.05) == (alo > 0 or ahi < 0), r["id"]  # the adjusted interval decides the same rows
        assert r["verdict"] == want, r["id"]
        assert (r["runs_to_decide"] != "") == (r["verdict"] == stats.UNDECIDED), r["id"]
    assert decided == sum(r["verdict"] != stats.UNDECIDED for r in rows if r["q"] not in ("", "nan")
                          and float(r["q"]) <= 0.05)


def _prose_by_section(text: str) -> list[tuple[str, str]]:
    """(section, line) for every prose line of the page after its introduction, outside generated blocks and code."""
    generated = [(b.start, b.end) for b in _tables().blocks(text)]
    out, section, offset, code = [], None, 0, False
    for line in text.split("\n"):
        inside = any(s <= offset < e for s, e in generated) or line.startswith("<!--")
        offset += len(line) + 1
        if line.startswith("```"):
            code = not code
            continue
        m = HEADING.match(line)
        if m:
            section = m.group(1)
            continue
        if code or inside or section is None:
            continue
        b = BULLET.match(line)
        out.append((b.group(1) if b else section, line))
    return out


def _bad_verdict_words(text: str) -> list[str]:
    """Each verdict word of the prose outside a generated ``<!-- verdict: ID -->`` span (a word typed by hand)."""
    spans = _tables().VERDICT_SPAN
    return [f"{section}: {word!r} in {line[:100]!r}" for section, line in _prose_by_section(text)
            for word in VERDICT_WORD.findall(spans.sub("", line))]


def test_every_verdict_word_on_the_page_is_generated_from_its_claims_row() -> None:
    """No verdict is typed by hand: every verdict word of the prose sits in a span the tool fills from verdicts.csv
    (test_every_table_matches_its_csv checks each span holds its claims' verdict), so a claim whose q crosses 0.05
    as the family grows changes its sentence too."""
    text = PAGE.read_text()
    assert _bad_verdict_words(text) == []
    assert len(_tables().VERDICT_SPAN.findall(text)) >= 40


def _typed_family_sizes(text: str) -> list[str]:
    """Each "family of N" (or "N claims in the family") typed outside the generated family span."""
    import re

    outside = _tables().FAMILY_SPAN.sub("", text)
    return re.findall(r"family of \d+|\d+ claims in the family", outside)


def test_the_family_size_is_never_typed_by_hand() -> None:
    """The family grows as claims are decided, so a size typed in the prose goes stale (section 2.1 said "a family
    of 55" at 63): the page states it only in the generated family span."""
    for page in (PAGE, PAGE.parents[1] / "README.md"):
        assert _typed_family_sizes(page.read_text()) == [], page
    assert _typed_family_sizes("decided by 3 seeds in a family of 55.") == ["family of 55"]


def test_a_verdict_span_holds_its_claims_verdict_and_fails_when_they_part(tmp_path: Path) -> None:
    t = _tables()
    (tmp_path / "results").mkdir()
    _write_csv(tmp_path / "results" / "verdicts.csv", [{"id": "a", "verdict": "reproduced"},
                                                       {"id": "b", "verdict": "undecided"},
                                                       {"id": "c", "verdict": "undecided"}])
    page = tmp_path / "findings.md"
    page.write_text("A is <!-- verdict: a -->undecided<!-- /verdict -->; B and C are "
                    "<!-- verdict: b,c -->undecided<!-- /verdict -->.\n")
    (diff,) = t.differences(page)
    assert "the verdict of a is 'reproduced', the page says 'undecided'" in diff
    assert t.main([str(page), "--write"]) == 0 and t.differences(page) == []
    assert "A is <!-- verdict: a -->reproduced<!-- /verdict -->" in page.read_text()
    page.write_text("B and C are <!-- verdict: b,a -->undecided<!-- /verdict -->; "
                    "D <!-- verdict: d -->x<!-- /verdict -->\n")
    before = page.read_text()
    problems = t.differences(page)
    assert "no longer share a verdict (b undecided; a reproduced): rewrite the sentence" in problems[0]
    assert "no claim d in verdicts.csv" in problems[1]
    assert t.main([str(page), "--write"]) == 2 and page.read_text() == before  # nothing half-written
    page.write_text("The family: <!-- family -->1 decided of 1<!-- /family -->.\n")
    (diff,) = t.differences(page)
    assert "the family is '0 decided of 0', the page says '1 decided of 1'" in diff  # no q column: none tested
    (tmp_path / "results" / "verdicts.csv").write_text("id,q,verdict\na,0.01,reproduced\nb,0.2,undecided\n"
                                                       "c,,pending\n")
    assert t.main([str(page), "--write"]) == 0
    assert page.read_text() == "The family: <!-- family -->1 decided of 2<!-- /family -->.\n"


QUOTED_Q = re.compile(r"\bq (?:= ?)?(?:0\.\d+|1)\b")


def test_prose_quotes_no_q_value_and_the_familys_size_is_the_csvs() -> None:
    """Every q moves when the family grows (section 10 adds its claims as its runs land), so a q typed in the prose
    goes stale: q-values live in the generated tables only. The family's size stated in the introduction is the
    CSV's."""
    text = PAGE.read_text()
    assert [line[:100] for _, line in _prose_by_section(text) if QUOTED_Q.search(line)] == []
    intro = text[:text.index("\n## ")]
    tested = [r for r in _verdict_rows() if r["q"] not in ("", "nan")]
    decided = sum(r["verdict"] != "undecided" for r in tested)
    assert f"family now: <!-- family -->{decided} decided of {len(tested)}<!-- /family -->," in intro.replace("\n", " ")
    assert QUOTED_Q.search("interval -1.33 to +2.20, q 0.49)") and not QUOTED_Q.search("a q-value, q-values")


def test_a_verdict_word_the_data_does_not_give_fails() -> None:
    text = PAGE.read_text()
    marker = "\n### 2.2 "
    assert marker in text
    assert _bad_verdict_words(text.replace(marker, "\nThis width claim is contradicted.\n" + marker, 1))


# ------------------------------------------------------------------------------------------------ README, goals


def test_readmes_summaries_are_generated_from_the_csvs() -> None:
    """README's goal table and its going-deeper summary come from goals.csv and verdicts.csv: an edit of either fails
    here, and the goals are recomputed from the committed benchmark results."""
    readme = ROOT / "README.md"
    assert _tables().differences(readme) == []
    text = readme.read_text()
    assert "<!-- table: docs/results/goals.csv" in text and "<!-- table: docs/results/verdicts.csv" in text
    assert load_script("goals").table() == (ROOT / "docs" / "results" / "goals.csv").read_text()


def test_a_goal_is_shown_only_when_its_interval_clears_it() -> None:
    with (ROOT / "docs" / "results" / "goals.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        lo, hi = float(r["ci_low"]), float(r["ci_high"])
        want = "shown" if lo > 0 else "missed" if hi < 0 else "not shown"
        assert r["verdict"] == want, r["id"]
    assert {r["verdict"] for r in rows} >= {"shown", "not shown"}


def test_a_where_line_can_exclude_a_value(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,v\nx,undecided\ny,reproduced\n")
    spec = "t.csv\na | {a}\nwhere: v!=undecided\n"
    assert _tables().render_table(spec, tmp_path).splitlines()[2:] == ["| y |"]
