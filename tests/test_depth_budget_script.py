"""scripts/depth_budget.sh, the rate x depth study of the findings page's section 10: every phase's command is one
the CLI accepts, with the options the design names; phase 4 trains the arm chosen on validation accuracy; phase 5
starts from phase 1's seed-0 runs; DRY_RUN passes --dry-run and copies nothing. The script runs here against a
stand-in for `vitlab` that records its arguments (the real commands train for hours)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_rate_depth import _phase2_at_24

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "depth_budget.sh"


def _run(tmp_path: Path, phases: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "fake_vitlab.py"
    fake.write_text(f"import json, os, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    "sys.exit(2 if os.environ.get('FAIL') in sys.argv else 0)\n")  # FAIL: refuse commands with it
    out = tmp_path / "runs"
    out.mkdir(exist_ok=True)
    full = {**os.environ, "PHASES": phases, "OUT": str(out), "D": str(tmp_path / "data"), "PYTHON": sys.executable,
            "VITLAB": f"{sys.executable} {fake}", "PYTHONPATH": os.pathsep.join(sys.path), **env}
    done = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_phase_is_a_command_the_cli_accepts_with_the_designs_settings(tmp_path):
    from vitlab.cli import build_parser

    _phase2_at_24(tmp_path / "runs")  # phase 4 needs phase 2's 24-block records to choose its arm
    done, calls = _run(tmp_path, "")  # the default order
    assert done.returncode == 0, done.stderr
    parser = build_parser()
    for argv in calls:
        args = parser.parse_args(argv)
        assert (args.epochs, args.limit_train, args.val_split, args.threads, args.workers) == (50, 15000, 0.33334, 1,
                                                                                                2), argv
        assert args.dataset == "fashion-mnist" and "stratify=true" in args.run_set, argv
    commands = [(a[0], _option(a, "--depths"), _option(a, "--variants"), "--finished-only" in a,
                 _option(a, "--output")) for a in calls]
    grid, out = str(tmp_path / "runs" / "depth_budget_grid"), str(tmp_path / "runs")
    budget, arms = f"{out}/depth_budget", "vit,qknorm,layerscale,cait,deepvit"
    assert commands == [  # phases 1 and 2 to 12 blocks first, then at 24 two arms at a time, grid then seeds, each
        # followed by the phase's whole table rewritten from the cells finished so far (nothing trained)
        ("lr-sensitivity", "6,12", arms, False, grid), ("lr-sensitivity", "6,12,24", arms, True, grid),
        ("depth-study", "6,12", arms, False, budget), ("depth-study", "6,12,24", arms, True, budget),
        ("lr-sensitivity", "24", "vit,qknorm", False, grid), ("lr-sensitivity", "6,12,24", arms, True, grid),
        ("depth-study", "24", "vit,qknorm", False, budget), ("depth-study", "6,12,24", arms, True, budget),
        ("lr-sensitivity", "24", "layerscale,cait", False, grid), ("lr-sensitivity", "6,12,24", arms, True, grid),
        ("depth-study", "24", "layerscale,cait", False, budget), ("depth-study", "6,12,24", arms, True, budget),
        ("lr-sensitivity", "6,12,24", arms, False, grid), ("depth-study", "6,12,24", arms, False, budget),
        ("depth-study", "6,12,24", "qknorm,layerscale,cait,deepvit", False, f"{out}/depth_budget_same_rate"),
        ("depth-study", "24", "qknorm", False, f"{out}/depth_budget_dp_uniform"),
        ("depth-study", "24", "qknorm", False, f"{out}/depth_budget_dp_linear"),
        ("lr-sensitivity", "6,24", "vit,qknorm", False, f"{out}/depth_budget_wortsman")]
    for argv in [a for a in calls if a[0] == "lr-sensitivity"]:
        assert _option(argv, "--lrs") == "5e-4,1e-3,2e-3,4e-3,8e-3" and _option(argv, "--bracket") == "3", argv
    for argv in [a for a in calls if _option(a, "--output") == budget]:
        assert _option(argv, "--seeds") == "5" and _option(argv, "--lr-from") == grid, argv
    calls = calls[10:]  # from here as before: calls[4] is phase 3, calls[5:7] phase 4, calls[-1] phase 5
    assert _option(calls[4], "--lr-of") == "vit" and _option(calls[4], "--reuse") == f"{out}/depth_budget"
    assert "vit" not in _option(calls[4], "--variants").split(",")  # the ViT's own runs are phase 2's
    # phase 4: the arm with the best validation accuracy at 24 blocks (qknorm here; cait has the best test accuracy)
    assert [_option(a, "--variants") for a in calls[5:7]] == ["qknorm", "qknorm"]
    assert [a[a.index("drop_path_rule=uniform") - 1:a.index("drop_path_rule=uniform") + 1] for a in calls[5:6]] == [
        ["--run-set", "drop_path_rule=uniform"]]
    assert _option(calls[-1], "--seeds") == "3" and _option(calls[-1], "--variants") == "vit,qknorm"


def test_phase_4_waits_for_phase_2(tmp_path):
    done, calls = _run(tmp_path, "4")
    assert done.returncode == 2 and calls == []
    assert "phase 4 needs phase 2's 24-block runs" in done.stderr


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_phase_5_starts_from_phase_1s_seed_0_runs(tmp_path, dry):
    """Seed 0 of its cells at the grid's own rates; a rate phase 1 added beyond an edge (0.016) stays behind: copied,
    it would be a rate seeds 1-2 lack unless this study's own bracket adds it, and the LR sensitivity counts only
    the seeds that finished every rate of the cell's curve."""
    grid = tmp_path / "runs" / "depth_budget_grid"
    for name in ("vit_depth6_lr0.002_seed0", "qknorm_depth24_lr0.0005_seed0", "qknorm_depth24_lr0.016_seed0",
                 "cait_depth6_lr0.002_seed0", "vit_depth12_lr0.002_seed0", "vit_depth6_lr0.002_seed1"):
        (grid / name).mkdir(parents=True)
        (grid / name / "summary.json").write_text("{}")
    done, calls = _run(tmp_path, "5", **({"DRY_RUN": "1"} if dry else {}))
    assert done.returncode == 0, done.stderr
    assert ("--dry-run" in calls[0]) is dry
    target = tmp_path / "runs" / "depth_budget_wortsman"
    copied = sorted(p.name for p in target.iterdir()) if target.exists() else []
    assert copied == ([] if dry else ["qknorm_depth24_lr0.0005_seed0", "vit_depth6_lr0.002_seed0"])
    assert ("phase 5 copies phase 1's seed-0 runs of these cells (2 there now)" in done.stderr) is dry


def test_an_unknown_phase_is_refused(tmp_path):
    done, calls = _run(tmp_path, "6")
    assert done.returncode == 2 and calls == [] and "unknown phase 6" in done.stderr
    for item in ("3:24:vit", "1:24:vit:x"):
        done, calls = _run(tmp_path, item)
        assert done.returncode == 2 and calls == [] and "only phases 1 and 2 take arms" in done.stderr, item


def test_a_phase_may_name_its_arms_and_a_dry_run_rewrites_nothing(tmp_path):
    done, calls = _run(tmp_path, "2:24:cait", DRY_RUN="1")
    assert done.returncode == 0, done.stderr
    assert [(a[0], _option(a, "--depths"), _option(a, "--variants")) for a in calls] == [("depth-study", "24", "cait")]
    assert "--dry-run" in calls[0] and "--finished-only" not in calls[0]


def test_a_phase_may_name_its_depths(tmp_path):
    done, calls = _run(tmp_path, "2:6 3:12,24 2")
    assert done.returncode == 0, done.stderr
    assert [(a[0], _option(a, "--depths"), "--finished-only" in a) for a in calls] == [
        ("depth-study", "6", False), ("depth-study", "6,12,24", True),  # phase 2's table rewritten whole after it
        ("depth-study", "12,24", False), ("depth-study", "6,12,24", False)]


def test_phase_5_may_name_its_depths_and_then_rewrites_its_whole_table(tmp_path):
    """5:6 trains Wortsman et al.'s 6-block cells (short runs, to end a session on), then the phase's table is rewritten
    from every cell finished so far (--finished-only: nothing trains); a depth phase 5 does not run is refused."""
    wortsman = str(tmp_path / "runs" / "depth_budget_wortsman")
    done, calls = _run(tmp_path, "5:6 5")
    assert done.returncode == 0, done.stderr
    assert [(a[0], _option(a, "--depths"), _option(a, "--seeds"), "--finished-only" in a, _option(a, "--output"))
            for a in calls] == [("lr-sensitivity", "6", "3", False, wortsman),
                                ("lr-sensitivity", "6,24", "3", True, wortsman),
                                ("lr-sensitivity", "6,24", "3", False, wortsman)]
    assert all(_option(a, "--variants") == "vit,qknorm" and _option(a, "--bracket") == "3" for a in calls)
    (tmp_path / "dry").mkdir()
    done, calls = _run(tmp_path / "dry", "5:24", DRY_RUN="1")  # a dry run rewrites nothing
    assert done.returncode == 0 and [(_option(a, "--depths"), "--dry-run" in a) for a in calls] == [("24", True)]
    for item in ("5:12", "5:1"):
        (tmp_path / item[2:]).mkdir()
        done, calls = _run(tmp_path / item[2:], item)
        assert done.returncode == 2 and calls == [], item
        assert f"{item}: phase 5 runs at 6 and 24 blocks" in done.stderr, done.stderr


def test_restored_records_get_the_grid_table_back_before_a_phase_reads_its_rates(tmp_path):
    """On a fresh machine `--restore-runs` brings back the grid's run records but not its sensitivity.csv, which
    phases 2-4 read (--lr-from): the script writes it from the finished runs first (--finished-only: nothing trains),
    once; a dry run writes nothing and says so; with the table there, or no grid runs at all, nothing is added."""
    grid = tmp_path / "runs" / "depth_budget_grid"
    (grid / "vit_depth6_lr0.002_seed0").mkdir(parents=True)
    (grid / "vit_depth6_lr0.002_seed0" / "summary.json").write_text("{}")
    done, calls = _run(tmp_path, "3:6 2:6")
    assert done.returncode == 0, done.stderr
    assert [(a[0], _option(a, "--depths"), "--finished-only" in a, _option(a, "--output")) for a in calls[:2]] == [
        ("lr-sensitivity", "6,12,24", True, str(grid)), ("depth-study", "6", False, f"{tmp_path}/runs/"
                                                                                      "depth_budget_same_rate")]
    assert [a[0] for a in calls].count("lr-sensitivity") == 1  # once, though the stand-in writes no table
    assert "writing it from the grid's finished runs" in done.stderr
    (tmp_path / "calls.jsonl").unlink()
    done, calls = _run(tmp_path, "3:6", DRY_RUN="1")
    assert done.returncode == 0 and [a[0] for a in calls] == ["depth-study"] and "--dry-run" in calls[0]
    assert "has finished runs but no sensitivity.csv" in done.stderr
    (grid / "sensitivity.csv").write_text("variant\n")
    (tmp_path / "calls.jsonl").unlink()
    done, calls = _run(tmp_path, "3:6")
    assert done.returncode == 0 and [a[0] for a in calls] == ["depth-study"]


def test_the_full_training_set_on_a_gpu_and_extra_options(tmp_path):
    from vitlab.cli import build_parser

    done, calls = _run(tmp_path, "1:6 2:6", FULL="1", DEVICE="cuda", WORKERS="4", EXTRA="--epochs 1 --lr 1e-3")
    assert done.returncode == 0, done.stderr
    for argv in calls:
        args = build_parser().parse_args(argv)
        assert args.limit_train is None and args.val_split == 0.08334 and args.device == "cuda", argv
        assert args.threads is None and args.workers == 4 and args.epochs == 1, argv  # EXTRA comes last: it wins
    done, calls = _run(tmp_path, "1:6")
    args = build_parser().parse_args(calls[-1])
    assert (args.limit_train, args.val_split, args.device, args.threads) == (15000, 0.33334, "auto", 1)


def test_a_dry_run_plans_every_phase_and_names_those_that_cannot_be_planned_yet(tmp_path):
    """A dry run of a study still under way: phase 3 cannot be planned yet (the stand-in refuses it, as vitlab refuses
    a --lr-from grid without the cell's rate), phase 4 has no arm yet; the phases after a refused one are planned all
    the same, and the script ends with exit 2 naming the two."""
    done, calls = _run(tmp_path, "1:6 2:6 3:6 4", DRY_RUN="1", FAIL="--lr-of")
    assert done.returncode == 2
    assert [(a[0], _option(a, "--depths")) for a in calls] == [("lr-sensitivity", "6"), ("depth-study", "6"),
                                                                ("depth-study", "6")]
    assert all("--dry-run" in a for a in calls)
    assert "phase 3:6 cannot be planned yet" in done.stderr and "phase 4 needs phase 2's 24-block runs" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("depth_budget.sh: dry run: phase(s) 3:6 4 cannot be planned "
                                                    "until the runs they read have finished")
    (tmp_path / "real").mkdir()
    done, calls = _run(tmp_path / "real", "3:6 1:6", FAIL="--lr-of")  # not a dry run: the first failure stops it
    assert done.returncode == 2 and len(calls) == 1


def test_the_script_is_read_whole_so_a_pull_while_it_runs_cannot_change_it(tmp_path):
    """The study runs for days and resumes with `git pull`: bash reads a script as it goes, so an update while a phase
    runs would run the rest of the new file from the old offset. The stand-in rewrites the script on its first call;
    every phase still runs as the original says."""
    (tmp_path / "scripts").mkdir()
    copy = tmp_path / "scripts" / "depth_budget.sh"
    copy.write_text(SCRIPT.read_text())
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "fake_vitlab.py"
    fake.write_text(f"import json, sys\nopen({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    f"open({str(copy)!r}, 'w').write('echo replaced; exit 7\\n' * 2000)\n")
    out = tmp_path / "runs"
    out.mkdir()
    env = {**os.environ, "PHASES": "1:6 2:6 3:6", "OUT": str(out), "D": str(tmp_path / "data"),
           "PYTHON": sys.executable, "VITLAB": f"{sys.executable} {fake}", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["bash", str(copy)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "replaced" not in done.stdout
    assert [json.loads(line)[0] for line in log.read_text().splitlines()] == [
        "lr-sensitivity", "lr-sensitivity", "depth-study", "depth-study", "depth-study"]  # 1:6 and 2:6 each rewrite
