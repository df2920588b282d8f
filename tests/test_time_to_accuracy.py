"""benchmarks/time_to_accuracy.py: the milestones it reports and a --quick smoke run of both sides."""

from __future__ import annotations

import json

import pytest
import torch

from _scripts import load_script


def _module():
    return load_script("time_to_accuracy")


def test_milestones_sum_seconds_until_the_first_epoch_at_the_threshold():
    rows = [{"epoch": 1, "test_acc": 0.5, "seconds": 2.0}, {"epoch": 2, "test_acc": 0.976, "seconds": 3.0},
            {"epoch": 3, "test_acc": 0.97, "seconds": 1.0}, {"epoch": 4, "test_acc": 0.981, "seconds": 4.0}]
    m = _module().milestones(rows)
    assert (m["s_to_0.975"], m["epoch_to_0.975"]) == (5.0, 2)
    assert (m["s_to_0.98"], m["epoch_to_0.98"]) == (10.0, 4)
    assert (m["final_acc"], m["best_acc"], m["total_s"]) == (0.981, 0.981, 10.0)
    assert _module().milestones(rows[:1])["s_to_0.975"] is None
    assert _module().spread([3.0, None, 1.0]) == "3.0 (1.0-never)"


def _m(s_to: float | None, total: float) -> dict:
    return {"s_to_0.975": s_to, "total_s": total, "epochs": 60}


def test_speedup_is_exact_when_both_reach_and_a_lower_bound_when_timm_does_not():
    mod = _module()
    vitlab = [_m(50.0, 400), _m(60.0, 400), _m(70.0, 400)]
    assert mod.speedup([_m(150.0, 440), _m(180.0, 440), _m(None, 440)], vitlab, 0.975) == (3.0, "exact")
    # timm's median seed never got there: its whole run (440 s) bounds its time from below
    ratio, kind = mod.speedup([_m(None, 440), _m(None, 450), _m(150.0, 440)], vitlab, 0.975)
    assert (ratio, kind) == (440 / 60, "at least")
    assert mod.speedup([_m(150.0, 440)] * 3, [_m(None, 400), _m(None, 400), _m(50.0, 400)], 0.975) == (None, "none")
    report = {"sides": {"timm": {"milestones": [_m(None, 440), _m(None, 450), _m(150.0, 440)]},
                        "vitlab": {"milestones": vitlab}}}
    mod.add_speedup(report, 0.975)
    text = mod.speedup_text(report, 0.975)
    assert text.startswith("at least 7.33x (timm never reached 97.5 % on 2 of 3 seeds in its 60 epochs"), text


def test_random_affine_keeps_shape_and_moves_pixels():
    x = torch.randn(4, 1, 28, 28)
    y = _module().random_affine(x, torch.Generator().manual_seed(0), _module().TIMM_RECIPE)
    assert y.shape == x.shape and not torch.allclose(x, y)


@pytest.mark.full  # the benchmark script end to end, both sides
def test_quick_run_writes_markdown_and_json(tmp_path, capsys):
    assert _module().main(["--quick", "--timm-threads", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "time_to_accuracy.json").read_text())
    assert set(report["sides"]) == {"vitlab", "timm"} and report["cpu"]
    for side in report["sides"].values():
        assert len(side["runs"]) == 1 and len(side["runs"][0]["rows"]) == 1
    text = (tmp_path / "time_to_accuracy.md").read_text()
    assert "| vitlab | 1 |" in text and "| timm | 1 |" in text and report["cpu"] in text
    # --render writes the markdown of a report again from its JSON
    (tmp_path / "time_to_accuracy.md").unlink()
    assert _module().main(["--render", str(tmp_path / "time_to_accuracy.json")]) == 0
    assert (tmp_path / "time_to_accuracy.md").read_text() == text
    assert _module().main(["--render", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_epoch_breakdown_quick_writes_shares_that_add_up(tmp_path):
    """benchmarks/epoch_breakdown.py: the three parts are timed, positive, and their shares sum to one."""
    module = load_script("epoch_breakdown")
    threads = torch.get_num_threads()
    try:
        assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads((tmp_path / "epoch_breakdown.json").read_text())
    assert set(result["cpu_seconds"]) == {"augmentation", "training step", "evaluation"}
    assert all(v > 0 for v in result["cpu_seconds"].values())
    assert abs(sum(result["share"].values()) - 1) < 1e-9
    assert result["cpu_seconds"]["training step"] > result["cpu_seconds"]["augmentation"]
    assert "| evaluation |" in (tmp_path / "epoch_breakdown.md").read_text()
