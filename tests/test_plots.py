"""vitlab.plots: the log-2 depth axis is drawn by one function that the depth and learning-rate studies' figures
both use."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitlab.plots import axes, depth, lr
from vitlab.plots.figure import new_figure


def test_depth_axis_is_log2_ticked_at_the_depths() -> None:
    ax = new_figure(3.0, 2.0).subplots()
    ax.plot([2, 8, 32], [1, 2, 3])
    axes.depth_axis(ax, [2, 8, 32], "depth")
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [2, 8, 32]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "8", "32"]
    assert len(ax.xaxis.get_minor_locator().tick_values(2, 32)) == 0  # minor ticks off
    assert ax.get_xlabel() == "depth"


@pytest.mark.parametrize("module", ["depth", "lr"])
def test_depth_and_lr_figures_draw_depth_with_depth_axis(module: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def spy(ax, depths, *args) -> None:  # noqa: ANN001
        seen.append(list(depths))
        axes.depth_axis(ax, depths, *args)

    mod = {"depth": depth, "lr": lr}[module]
    monkeypatch.setattr(mod, "depth_axis", spy)
    if module == "depth":
        agg = [{"variant": "vit", "depth": d, "test_acc_mean": 0.5, "test_acc_std": 0.1} for d in (4, 2, 8)]
        depth.plot_against_depth(agg, ["vit"], [("test_acc", "acc", 100.0)], tmp_path / "d.png", "t")
    else:
        sens = [{"variant": "vit", "depth": d, "lr_sensitivity": 0.1, "best_val_loss": 1.0, "divergence_rate": 0.0}
                for d in (4, 2, 8)]
        lr.plot_sensitivity(sens, ["vit"], tmp_path / "s.png")
    assert seen and all(s == [2, 4, 8] for s in seen)
    assert next(tmp_path.iterdir()).stat().st_size > 0


def test_similarity_of_a_one_block_model_read_back_from_json_draws(tmp_path):
    """One block has no pair of blocks to compare: its similarity is NaN, which diagnostics.json stores as null and
    reads back as None; the heatmap draws it as empty and its title says n/a."""
    import json

    from vitlab.plots.depth import plot_similarity

    diag = {"collapse": [{"group": "self_attention", "mean_similarity": float("nan"), "similarity": [[float("nan")]]}]}
    diag = json.loads(json.dumps(diag).replace("NaN", "null"))  # as diagnostics.json reads back
    out = plot_similarity({"vit": diag}, 1, tmp_path / "sim.png")
    assert out.is_file() and out.stat().st_size > 0


def test_similarity_names_a_seed_other_than_0_and_draws_nothing_without_diagnostics(tmp_path, monkeypatch):
    import matplotlib.axes

    from vitlab.plots.depth import plot_similarity

    titles = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, s, *a, **k: (titles.append(s),
                                                                                     real(self, s, *a, **k))[1])
    group = {"group": "self_attention", "mean_similarity": 0.5, "similarity": [[1.0, 0.5], [0.5, 1.0]]}
    out = plot_similarity({"vit": {"collapse": [group], "seed": 2}, "cait": {"collapse": [group]}}, 2,
                          tmp_path / "sim.png")
    assert out.is_file() and titles == ["vit seed 2 (mean 0.50)", "cait (mean 0.50)"]
    empty = {"residual_ratios": [], "collapse": [], "collapse_pre_mix": []}  # a failed run's diagnostics
    assert plot_similarity({"vit": empty}, 2, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_accuracy_figure_draws_the_median_line_and_every_seed(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Given the runs, the line is the median over seeds (not the mean one outlying seed drags); each seed a dot."""
    import matplotlib.axes

    lines, dots = [], []
    real_plot, real_scatter = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.scatter

    def plot(self, x, y, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        lines.append((list(x), list(y)))
        return real_plot(self, x, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, *a, **k: (dots.extend(y), real_scatter(self, x, y, *a, **k))[1])
    runs = [{"variant": "vit", "depth": d, "seed": s, "test_acc": acc}
            for d, accs in ((2, (0.80, 0.82, 0.10)), (4, (0.85, 0.86, 0.87))) for s, acc in enumerate(accs)]
    agg = [{"variant": "vit", "depth": d, "test_acc_mean": 0.5, "test_acc_std": 0.1} for d in (2, 4)]
    depth.plot_accuracy(agg, ["vit"], tmp_path / "a.png", runs=runs)
    assert lines == [([2, 4], [pytest.approx(80.0), pytest.approx(86.0)])]
    assert sorted(dots) == pytest.approx(sorted(100 * r["test_acc"] for r in runs))
    assert (tmp_path / "a.png").stat().st_size > 0


def test_accuracy_figure_draws_a_point_short_of_its_planned_seeds_apart(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A study still running has points with fewer finished seeds than planned: the median line leaves them out and
    each is a hollow marker at the median of what finished, labelled k/planned; the title says what hollow means.
    Without ``planned`` (or with every point complete) the line runs through every point."""
    import matplotlib.axes
    import matplotlib.figure

    lines, notes, titles = [], [], []
    real_plot, real_annotate = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.annotate
    real_suptitle = matplotlib.figure.Figure.suptitle

    def plot(self, x, y, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        lines.append((list(x), list(y), k.get("markerfacecolor")))
        return real_plot(self, x, y, *a, **k)

    def annotate(self, text, xy, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        notes.append((text, xy))
        return real_annotate(self, text, xy, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "annotate", annotate)
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle",
                        lambda self, t, *a, **k: (titles.append(t), real_suptitle(self, t, *a, **k))[1])
    runs = [{"variant": "vit", "depth": d, "seed": s, "test_acc": acc}
            for d, accs in ((2, (0.80, 0.82, 0.84)), (4, (0.85, 0.86, 0.87)), (8, (0.90,)))
            for s, acc in enumerate(accs)]
    agg = [{"variant": "vit", "depth": d, "test_acc_mean": 0.5, "test_acc_std": 0.1} for d in (2, 4, 8)]
    depth.plot_accuracy(agg, ["vit"], tmp_path / "a.png", runs=runs, planned=3)
    assert lines == [([2, 4], [pytest.approx(82.0), pytest.approx(86.0)], None),
                     ([8], [pytest.approx(90.0)], "none")]  # the one-seed point: hollow, off the line
    assert notes == [("1/3", (8, pytest.approx(90.0)))]
    assert "hollow: fewer than 3 seeds finished" in titles[-1]
    lines.clear(), notes.clear()
    depth.plot_accuracy(agg, ["vit"], tmp_path / "b.png", runs=runs)
    assert lines == [([2, 4, 8], [pytest.approx(82.0), pytest.approx(86.0), pytest.approx(90.0)], None)]
    assert notes == [] and "hollow" not in titles[-1]
    lines.clear()
    depth.plot_accuracy(agg, ["vit"], tmp_path / "c.png", runs=[r for r in runs if r["depth"] != 8], planned=3)
    assert lines == [([2, 4], [pytest.approx(82.0), pytest.approx(86.0)], None)] and "hollow" not in titles[-1]


def test_sweep_figure_draws_the_median_line_and_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's figure, given each point's seeds, draws the median over seeds as the line (an outlying seed moves
    the mean, not the line) and each seed as a dot; the time panel its median; without seeds, mean +- std."""
    import matplotlib.axes

    from vitlab.experiments.sweep import Series, SweepParam
    from vitlab.plots.study import plot_param

    lines, dots, bars = [], [], []
    real_plot, real_scatter, real_errorbar = (matplotlib.axes.Axes.plot, matplotlib.axes.Axes.scatter,
                                              matplotlib.axes.Axes.errorbar)

    def plot(self, x, y, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        lines.append((list(x), list(y)))
        return real_plot(self, x, y, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, *a, **k: (dots.extend(y), real_scatter(self, x, y, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar",
                        lambda self, x, y, *a, **k: (bars.append(list(y)), real_errorbar(self, x, y, *a, **k))[1])
    param = SweepParam("depth", "model", [2, 4])
    seeds = [[0.80, 0.82, 0.10], [0.85, 0.86, 0.87]]
    s = Series("", [2, 4], [0.573, 0.86], [0.4, 0.01], [10.0, 20.0], [1.0, 1.0], acc_median=[0.80, 0.86],
               acc_seeds=seeds, time_median=[9.0, 19.0])
    plot_param([s], param, ["2", "4"], tmp_path / "s.png", "t")
    assert lines == [([2.0, 4.0], [pytest.approx(80.0), pytest.approx(86.0)]), ([2.0, 4.0], [9.0, 19.0])]
    assert sorted(dots) == pytest.approx(sorted(100 * a for xs in seeds for a in xs)) and not bars
    lines.clear()
    dots.clear()
    plot_param([Series("", [2, 4], [0.573, 0.86], [0.4, 0.01], [10.0, 20.0], [1.0, 1.0])], param, ["2", "4"],
               tmp_path / "m.png", "t")
    assert bars == [pytest.approx([57.3, 86.0]), [10.0, 20.0]] and not dots
    assert (tmp_path / "s.png").stat().st_size > 0 and (tmp_path / "m.png").stat().st_size > 0


def test_compare_figure_draws_the_median_bar_and_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vitlab compare`'s figure, given the runs, draws each row's bar at the median over seeds (a failed or
    outlying seed does not move it) and every finished seed as a dot on its own row; without them, mean +- std."""
    import matplotlib.axes

    from vitlab.plots.study import plot_compare

    bars, dots = [], []
    real_barh, real_scatter = matplotlib.axes.Axes.barh, matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "barh",
                        lambda self, y, w, *a, **k: (bars.append((list(w), k.get("xerr"))),
                                                     real_barh(self, y, w, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter",
                        lambda self, x, y, *a, **k: (dots.append((list(x), list(y))),
                                                     real_scatter(self, x, y, *a, **k))[1])
    runs = [{"label": lab, "start": "scratch", "seed": s, "test_acc": acc, "train_time_s": t}
            for lab, accs, t in (("a", (0.80, 0.82, 0.10), 10.0), ("b", (0.85, 0.86, float("nan")), 20.0))
            for s, acc in enumerate(accs)]
    agg = [{"label": lab, "start": "scratch", "test_acc_mean": 0.5, "test_acc_std": 0.1, "test_acc_median": med,
            "train_time_s_mean": t, "train_time_s_std": 1.0, "train_time_s_median": t, "params": 1e6,
            "macs": None, "matmul_macs": None} for lab, med, t in (("a", 0.80, 10.0), ("b", 0.855, 20.0))]
    plot_compare(agg, tmp_path / "c.png", "t", runs)
    assert bars[0] == ([pytest.approx(80.0), pytest.approx(85.5)], None) and bars[1] == ([10.0, 20.0], None)
    # rows are drawn top to bottom: a at y = 1, b at y = 0; b's failed (NaN) seed has no dot
    assert dots[0] == ([pytest.approx(80.0), pytest.approx(82.0), pytest.approx(10.0)], [1, 1, 1])
    assert dots[1] == ([pytest.approx(85.0), pytest.approx(86.0)], [0, 0])
    bars.clear()
    dots.clear()
    plot_compare(agg, tmp_path / "m.png", "t")
    assert bars[0] == ([50.0, 50.0], [10.0, 10.0]) and not dots
    assert (tmp_path / "c.png").stat().st_size > 0 and (tmp_path / "m.png").stat().st_size > 0
