"""``vitlab lr-sensitivity --bracket N``: the extension rule (a cell whose best rate is on the edge of its rates gets
the next rate beyond that edge, by the grid's own step, until its best is interior, N rates were added on that side,
or the next rate is not one a run can train at), the sensitivity over the shared grid with its minimum over the
cell's whole curve, and a small study end to end with a stand-in trainer whose validation loss is a known function
of the rate (the extension runs, the tables, the report, resume, the dry run, ``depth-study --lr-from``'s warning)."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest

from _helpers import cli_error, read_rows
from _study import finish
from vitlab.experiments import runs
from vitlab.experiments.lr_sensitivity import (
    UNFINISHED,
    extensions,
    lr_table,
    next_rate,
    seed_sensitivities,
    sensitivity,
)
from vitlab.train.config import RunConfig

L0 = math.log(10)
GRID = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]


def valid(lr: float) -> None:
    RunConfig(lr=lr).validate()


def curve(best: float, rates=GRID) -> dict[float, float]:
    """A loss per rate, lowest at ``best``: the squared distance in log rate."""
    return {lr: 0.3 + 0.1 * math.log(lr / best) ** 2 for lr in rates}


# ---------------------------------------------------------------- the extension rule


def test_a_best_rate_on_the_high_edge_adds_the_edge_times_the_grids_step():
    assert next_rate(curve(3e-2), GRID, 2, valid) == (1.6e-2, "")


def test_a_best_rate_on_the_low_edge_adds_the_edge_over_the_grids_step():
    assert next_rate(curve(1e-4), GRID, 2, valid) == (2.5e-4, "")


def test_the_step_is_the_grids_own_at_that_edge_and_the_rate_is_rounded():
    grid = [1e-3, 3e-3, 1e-2]  # steps 3 at the low end, 3.33 at the high end
    assert next_rate(curve(1.0, grid), grid, 1) == (0.0333333, "")
    assert next_rate(curve(1e-6, grid), grid, 1) == (0.000333333, "")
    assert next_rate(curve(1.0, [*grid, 0.0333333]), grid, 2) == (0.111111, "")  # 3.33 again, from the grid's edge


def test_an_interior_best_rate_adds_nothing():
    assert next_rate(curve(2e-3), GRID, 2, valid) == (None, "")
    assert next_rate(curve(2e-2, [*GRID, 1.6e-2, 3.2e-2]), GRID, 2) == (None, "")  # interior of the whole curve


def test_ties_go_to_the_lower_rate():
    flat = {lr: L0 for lr in GRID}  # every run diverged: the lowest rate is the best, so go lower
    assert next_rate(flat, GRID, 1) == (2.5e-4, "")


def test_n_rates_added_on_a_side_stop_that_side():
    rate, why = next_rate(curve(1.0, [*GRID, 1.6e-2, 3.2e-2]), GRID, 2, valid)
    assert rate is None and "best rate 0.032 is the highest of its rates" in why and "--bracket 2" in why
    assert next_rate(curve(1.0, [*GRID, 1.6e-2, 3.2e-2]), GRID, 3, valid) == (6.4e-2, "")
    # two rates added on the low side do not use up the high side's
    assert next_rate(curve(1.0, [1.25e-4, 2.5e-4, *GRID]), GRID, 2, valid) == (1.6e-2, "")
    rate, why = next_rate(curve(1.0), GRID, 0)
    assert rate is None and "--bracket N adds rates beyond it" in why


def test_a_next_rate_no_run_can_train_at_stops_the_cell():
    grid = [2.5, 5.0]
    assert next_rate(curve(100.0, grid), grid, 3, valid) == (10.0, "")  # lr may be 10 at most
    rate, why = next_rate(curve(100.0, [*grid, 10.0]), grid, 3, valid)
    assert rate is None and "the next rate 20 is not one a run can train at (lr must be in" in why


def _row(variant, lr, seed, loss, *, depth=2, failed=False, diverged=False):
    return {"variant": variant, "depth": depth, "lr": lr, "seed": seed, "val_loss": loss, "val_acc": 0.5,
            "test_acc": 0.5, "train_loss": loss, "max_logit": 3.0, "diverged": diverged, "failed": failed}


def test_one_round_over_rows_uses_the_mean_over_seeds_and_waits_for_every_run():
    lrs = [1e-3, 2e-3]
    rows = [_row("vit", 1e-3, 0, 0.9), _row("vit", 1e-3, 1, 0.1),  # mean 0.5
            _row("vit", 2e-3, 0, 0.4), _row("vit", 2e-3, 1, 0.4),  # mean 0.4: the high edge
            _row("ls", 1e-3, 0, 0.3), _row("ls", 1e-3, 1, 0.3),
            _row("ls", 2e-3, 0, 0.4), _row("ls", 2e-3, 1, 0.4, failed=True),  # not settled
            _row("cait", 1e-3, 0, 0.3), _row("cait", 2e-3, 0, 0.4)]  # seed 1 not read back: not settled
    adds, notes = extensions(rows, L0, lrs, [0, 1], 2, valid)
    assert adds == [("vit", 2, 4e-3)]
    assert notes == {("ls", 2): UNFINISHED, ("cait", 2): UNFINISHED}


def test_the_sensitivity_is_a_mean_over_the_grid_with_the_minimum_over_the_whole_curve():
    lrs = [1e-3, 2e-3]
    rows = [_row("vit", 1e-3, 0, 0.9), _row("vit", 2e-3, 0, 0.5), _row("vit", 4e-3, 0, 0.2),
            _row("vit", 8e-3, 0, 0.6),  # the best, 4e-3, lies beyond the grid
            _row("vit", 1e-3, 1, 0.8), _row("vit", 2e-3, 1, 0.4),  # seed 1 lacks the added rates: it does not count
            _row("vit", 4e-3, 1, 0.1, failed=True),
            _row("ls", 1e-3, 0, 0.9), _row("ls", 2e-3, 0, 0.5)]  # the grid alone, best on its edge
    per_lr = lr_table(rows, L0)
    per_seed = seed_sensitivities(rows, L0, lrs)
    assert per_seed[("vit", 2)] == {0: pytest.approx((0.9 + 0.5) / 2 - 0.2)}  # not the grid's own minimum 0.5
    sens = {s["variant"]: s for s in sensitivity(per_lr, lrs, per_seed)}
    vit, ls = sens["vit"], sens["ls"]
    assert (vit["lr_low"], vit["lr_high"], vit["best_lr"], vit["bracketed"]) == (1e-3, 8e-3, 4e-3, True)
    assert vit["lr_sensitivity"] == pytest.approx(0.5) and vit["lrs"] == 4
    assert (ls["lr_low"], ls["lr_high"], ls["best_lr"], ls["bracketed"]) == (1e-3, 2e-3, 2e-3, False)
    assert ls["lr_sensitivity"] == pytest.approx(0.2)


# ---------------------------------------------------------------- a study end to end, a stand-in trainer

TARGET = {"vit": 1.5e-2, "layerscale": 3e-3, "tfixup": 1e-4}  # where each variant's loss is lowest


def loss_of(name: str, lr: float) -> float:
    """The final validation loss a run named ``name`` reaches at ``lr``: lowest at its variant's target."""
    return 0.3 + 0.1 * math.log(lr / TARGET[name.split("_depth")[0]]) ** 2


def fake_train(cfg: RunConfig, init: str | None = None) -> dict:
    """Writes the record a finished run leaves, its validation loss a known function of its rate."""
    name = Path(cfg.output).name
    with open(Path(cfg.output).parent / "calls.txt", "a") as fh:
        fh.write(f"{name}\n")
    return finish(cfg, {"final_val_loss": loss_of(name, cfg.lr), "final_val_acc": 0.5, "final_test_acc": 0.5,
                        "epochs": 1, "train_time_s": 1.0})


def study(out: Path, *extra: str) -> list[str]:
    """3 variants x 3 rates x 2 seeds at depth 1."""
    return ["lr-sensitivity", "--depths", "1", "--variants", "vit,layerscale,tfixup", "--lrs", "2e-3,4e-3,8e-3",
            "--seeds", "2", "--epochs", "1", "--batch-size", "16", "--limit-train", "64", "--limit-test", "32",
            "--val-split", "0.25", "--set", "embed_dim=16", "--set", "num_heads=2", "--no-progress",
            "--output", str(out), *extra]


def calls(out: Path) -> list[str]:
    path = out / "calls.txt"
    return path.read_text().split() if path.is_file() else []


def cli(argv: list[str]) -> tuple[int, str]:
    from vitlab.cli import main

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    return code, stdout.getvalue()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list:
    """The stand-in trainer, and figures not drawn (drawing is most of a tiny study's time; the figure of cells with
    different rates is drawn below): returns the summary.csv rows each loss figure was given."""
    from vitlab.plots import lr

    drawn: list = []
    monkeypatch.setattr(runs, "train_run", fake_train)
    def empty(*args):
        Path(args[-1]).write_bytes(b"")  # the file the report names

    for name in ("plot_logit_growth", "plot_logits", "plot_sensitivity"):
        monkeypatch.setattr(lr, name, empty)
    monkeypatch.setattr(lr, "plot_loss_vs_lr", lambda per_lr, *args: drawn.append(per_lr) or empty(*args))
    return drawn


def test_the_loss_figure_draws_cells_of_different_rates(tmp_path):
    from vitlab.plots.lr import plot_loss_vs_lr

    rows = [_row("vit", lr, 0, 0.3 + i / 10) for i, lr in enumerate((5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2))]
    rows += [_row("ls", lr, 0, 0.5, depth=d) for lr in (1e-3, 2e-3, 4e-3) for d in (2, 4)]
    path = plot_loss_vs_lr(lr_table(rows, L0), ["vit", "ls"], L0, tmp_path / "loss_vs_lr.png")
    assert path.stat().st_size > 1000


def test_a_study_extends_each_edge_cell_until_bracketed_and_resumes_without_training(tmp_path, fake, capsys):
    out = tmp_path / "study"
    code, text = cli(study(out, "--bracket", "2"))
    assert code == 0
    trained = calls(out)
    grid = 3 * 3 * 2
    # vit (optimum 1.5e-2): 1.6e-2 then 3.2e-2, bracketed; tfixup (optimum 1e-4): 1e-3 then 5e-4, still on the edge;
    # layerscale (optimum 3e-3) interior: nothing added. Every seed of an extended cell, and no other cell.
    extra = {f"{v}_depth1_lr{lr}_seed{s}" for v, lrs in (("vit", ("0.016", "0.032")), ("tfixup", ("0.001", "0.0005")))
             for lr in lrs for s in (0, 1)}
    assert len(trained) == len(set(trained)) == grid + len(extra) and set(trained) - extra == {
        f"{v}_depth1_lr{lr}_seed{s}" for v in ("vit", "layerscale", "tfixup") for lr in ("0.002", "0.004", "0.008")
        for s in (0, 1)}
    # a cell's next rate trains as soon as every run of its curve finished, before the rest of the grid: vit's
    # curve is complete after its seed-1 runs, so 1.6e-2 trains before layerscale's seed 1; its 3.2e-2 after both
    # seeds of 1.6e-2 (every seed of a rate finishes before the cell's next rate is decided)
    at = {name: i for i, name in enumerate(trained)}
    assert at["vit_depth1_lr0.008_seed1"] < at["vit_depth1_lr0.016_seed0"] < at["layerscale_depth1_lr0.002_seed1"]
    assert max(at[f"vit_depth1_lr0.016_seed{s}"] for s in (0, 1)) < at["vit_depth1_lr0.032_seed0"]
    assert at["vit_depth1_lr0.032_seed1"] < at["layerscale_depth1_lr0.002_seed1"]
    sens = {s["variant"]: s for s in read_rows(out / "sensitivity.csv")}
    vit, ls, tf = sens["vit"], sens["layerscale"], sens["tfixup"]
    assert (vit["lr_low"], vit["lr_high"], vit["best_lr"], vit["bracketed"]) == ("0.002", "0.032", "0.016", "True")
    assert vit["lrs"] == "5" and vit["runs"] == "10"
    assert (ls["lr_low"], ls["lr_high"], ls["best_lr"], ls["bracketed"]) == ("0.002", "0.008", "0.004", "True")
    assert (tf["lr_low"], tf["lr_high"], tf["best_lr"], tf["bracketed"]) == ("0.0005", "0.008", "0.0005", "False")
    # the mean over the shared grid of each seed's loss minus its minimum over the whole curve
    grid_lrs = (2e-3, 4e-3, 8e-3)
    for variant, best in (("vit", 1.6e-2), ("layerscale", 4e-3), ("tfixup", 5e-4)):
        capped = {lr: min(loss_of(variant, lr), L0) for lr in (*grid_lrs, best)}
        expected = sum(capped[lr] for lr in grid_lrs) / 3 - capped[best]
        assert float(sens[variant]["lr_sensitivity"]) == pytest.approx(expected)
    summary = read_rows(out / "summary.csv")
    assert sorted(float(a["lr"]) for a in summary if a["variant"] == "vit") == [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]
    assert len(read_rows(out / "results.csv")) == len(trained)
    assert {(a["variant"], a["lr"]) for a in fake[-1]} == {(a["variant"], float(a["lr"])) for a in summary}
    lines = {line.split(":")[0].split()[0]: line for line in text.splitlines() if "depth   1:" in line}
    assert "bracketed (interior of 0.002..0.032)" in lines["vit"]
    assert "bracketed (interior of 0.002..0.008)" in lines["layerscale"]
    assert "not bracketed: on the edge of 0.0005..0.008 (best rate 0.0005 is the lowest of its rates; --bracket 2 " \
        "adds no further rate on that side)" in lines["tfixup"]
    before = {n: (out / n).read_text() for n in ("results.csv", "summary.csv", "sensitivity.csv")}

    code, _ = cli(study(out, "--bracket", "2"))  # the same command: every run read back, the same tables
    assert code == 0 and calls(out) == trained
    assert {n: (out / n).read_text() for n in before} == before

    code, _ = cli(study(out))  # without --bracket: the grid's tables (the extension runs stay on disk, unused)
    assert code == 0 and calls(out) == trained
    assert len(read_rows(out / "summary.csv")) == 9
    assert read_rows(out / "sensitivity.csv")[2]["bracketed"] == "False"  # vit, on the edge of the grid again
    code, _ = cli(study(out, "--bracket", "2", "--finished-only"))
    assert code == 0 and calls(out) == trained
    assert {n: (out / n).read_text() for n in before} == before

    # vitlab depth-study --lr-from reads the rates and warns once for each cell on the edge
    from vitlab.experiments.rates import best_rates

    capsys.readouterr()
    rates = best_rates(out)
    err = capsys.readouterr().err.splitlines()
    assert rates[("tfixup", 1)] == 5e-4 and rates[("vit", 1)] == 1.6e-2
    assert len(err) == 1 and "tfixup at depth 1: best rate 0.0005 is on the edge of its grid" in err[0]
    assert err[0].endswith("rerun the lr-sensitivity study with --bracket 2")


def test_a_dry_run_lists_the_extensions_finished_runs_determine_and_writes_nothing(tmp_path, fake):
    out = tmp_path / "study"
    code, text = cli(study(out, "--bracket", "2", "--dry-run"))
    assert code == 0 and not out.exists()
    lines = text.splitlines()
    assert sum(line.startswith("[") for line in lines) == 18
    assert "0 run(s) beyond the grid's edge" in text and "further rates are decided only after the grid's runs " \
        "finish: 3 of 3 cells" in text
    cli(study(out, "--bracket", "1"))  # vit and tfixup each add one rate, both still on the edge
    trained = calls(out)
    code, text = cli(study(out, "--bracket", "2", "--dry-run"))
    assert code == 0 and calls(out) == trained
    plans = [line for line in text.splitlines() if line.startswith("[")]
    assert len(plans) == 18 + 4 + 4
    assert sum("finished, read back" in line for line in plans) == 22
    assert sum("_lr0.032_seed" in line and "finished" not in line for line in plans) == 2
    assert sum("_lr0.0005_seed" in line and "finished" not in line for line in plans) == 2
    assert "8 run(s) beyond the grid's edge follow from the finished runs" in text
    assert "further rates are decided only after the grid's runs finish: 2 of 3 cells" in text


def test_a_dry_run_adds_no_rate_to_a_cell_whose_grid_has_not_finished(tmp_path, fake):
    out = tmp_path / "study"
    argv = study(out, "--variants", "vit,tfixup", "--seeds", "1")
    argv[argv.index("--lrs") + 1] = "4e-3,8e-3"
    assert cli(argv)[0] == 0  # two of the grid's three rates finished: vit best at 8e-3, tfixup at 4e-3
    argv[argv.index("--lrs") + 1] = "2e-3,4e-3,8e-3"
    code, text = cli([*argv, "--bracket", "2", "--dry-run"])
    assert code == 0
    plans = [line.split(":")[0].split()[-1] for line in text.splitlines() if line.startswith("[")]
    assert len(plans) == len(set(plans)) == 6  # the grid once, no rate beyond it: 2e-3 may still be either's best
    assert "0 run(s) beyond the grid's edge" in text and "2 of 2 cells may each add" in text


def test_a_negative_bracket_is_refused_in_one_line(tmp_path, capsys, fake):
    assert "--bracket must be >= 0" in cli_error(capsys, study(tmp_path / "study", "--bracket", "-1"))
    assert not (tmp_path / "study").exists()


def test_a_cell_whose_next_rate_is_invalid_stops_and_says_so(tmp_path, fake, monkeypatch):
    monkeypatch.setitem(TARGET, "vit", 20.0)  # the optimum lies above any rate a run can train at
    out = tmp_path / "study"
    argv = study(out, "--bracket", "5", "--variants", "vit", "--seeds", "1")
    argv[argv.index("--lrs") + 1] = "1.25,2.5"
    code, text = cli(argv)
    assert code == 0 and calls(out)[2:] == ["vit_depth1_lr5_seed0", "vit_depth1_lr10_seed0"]
    assert "the next rate 20 is not one a run can train at (lr must be in (0, 10], got 20)" in text
    row = read_rows(out / "sensitivity.csv")[0]
    assert (row["lr_high"], row["best_lr"], row["bracketed"]) == ("10.0", "10.0", "False")


@pytest.mark.full  # two worker processes started each round (each imports torch)
def test_worker_processes_train_the_extension_rounds(tmp_path, fake):
    out = tmp_path / "study"
    code, _ = cli(study(out, "--bracket", "2", "--workers", "2"))
    assert code == 0
    assert len(calls(out)) == 18 + 8
    assert read_rows(out / "sensitivity.csv")[2]["bracketed"] == "True"


# ---------------------------------------------------------------- runs added while the study runs (run_study's follow)


def _fake_run_trainer(cfg: RunConfig, init: str | None = None) -> dict:
    name = Path(cfg.output).name
    with open(Path(cfg.output).parent / "calls.txt", "a") as fh:
        fh.write(f"{name}\n")
    return finish(cfg, {"final_test_acc": 0.5 + cfg.seed / 100, "epochs": 1, "train_time_s": 1.0})


def test_a_run_follow_adds_trains_before_the_queue_and_a_finished_one_is_read_back(tmp_path):
    from vitlab.experiments.executors import ExecutorConfig

    def spec(name: str, seed: int) -> runs.RunSpec:
        return runs.RunSpec(name, RunConfig(seed=seed, threads=1), {"seed": seed})

    out = tmp_path / "study"
    # "done" finished in an earlier invocation: follow adds it after "a", it is read back and follow asked again
    first, _ = runs.run_study([spec("done", 9)], out, "depth-study", trainer=_fake_run_trainer)
    (out / "calls.txt").unlink()
    asked: list[set[str]] = []

    def follow(summaries: dict[str, dict]) -> list[runs.RunSpec]:
        asked.append(set(summaries))
        if "a" in summaries and "done" not in asked_names:
            asked_names.add("done")
            return [spec("done", 9), spec("after-a", 3)]
        if "done" in summaries and "again" not in asked_names:
            asked_names.add("again")
            return [spec("again", 4)]
        return []

    asked_names: set[str] = set()
    _, pairs = runs.run_study([spec("a", 0), spec("b", 1), spec("c", 2)], out, "depth-study",
                              trainer=_fake_run_trainer, executor=ExecutorConfig(workers=1), follow=follow)
    assert calls(out) == ["a", "after-a", "again", "b", "c"]  # added at the front, in the order follow gave them
    assert [s.name for s, _ in pairs] == ["a", "b", "c", "done", "after-a", "again"]
    assert pairs[3][1]["final_test_acc"] == 0.59 and all(not runs.failed(s) for _, s in pairs)
    assert asked[0] == set()  # asked first with what was read back (nothing of the grid)
    with pytest.raises(ValueError, match="finished_only"):
        runs.run_study([spec("a", 0)], out, "depth-study", finished_only=True, follow=follow)


def test_a_cell_with_a_failed_run_adds_no_rate_while_the_others_extend(tmp_path, fake, monkeypatch):
    def failing(cfg: RunConfig, init: str | None = None) -> dict:
        if Path(cfg.output).name == "vit_depth1_lr0.004_seed1":
            raise RuntimeError("out of memory")
        return fake_train(cfg, init)

    monkeypatch.setattr(runs, "train_run", failing)
    out = tmp_path / "study"
    code, _ = cli(study(out, "--bracket", "1"))
    assert code == runs.RUNS_FAILED
    trained = calls(out)
    assert not any("vit_depth1_lr0.016" in name for name in trained)  # vit's curve is not complete: no rate added
    assert {"tfixup_depth1_lr0.001_seed0", "tfixup_depth1_lr0.001_seed1"} <= set(trained)
