"""scipy is the optional extra ``vitlab[stats]``: without it the statistics stop with one line naming the fix, and
nothing ``vitlab train`` or ``vitlab.create_model`` imports needs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.experiments import stats

FIX = "pip install 'vitlab[stats]'"


@pytest.fixture
def no_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("scipy", "scipy.stats", "scipy.optimize"):
        monkeypatch.setitem(sys.modules, name, None)  # `import scipy` raises ImportError, as when it is not installed


@pytest.mark.parametrize("call", [lambda: stats.welch([1.0, 2.0, 3.0], [2.0, 3.0, 5.0]),
                                  lambda: stats.compare([1.0, 2.0, 3.0], [2.0, 3.0, 5.0]),
                                  lambda: stats.mde_welch(3, 3, 1.0)], ids=["welch", "compare", "mde_welch"])
def test_statistics_without_scipy_name_the_extra(no_scipy: None, call) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match=FIX.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_verdict_without_scipy_is_one_line_and_exit_2(no_scipy: None, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    for arm, accs in (("a", (0.90, 0.92, 0.91)), ("b", (0.85, 0.88, 0.86))):
        for seed, acc in enumerate(accs):
            run = tmp_path / arm / f"run_seed={seed}"
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"final_test_acc": acc}))
            (run / "config.json").write_text(json.dumps({"model": {"num_classes": 10}, "run": {"seed": seed}}))
    assert main(["verdict", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert FIX in err and len(err.splitlines()) == 1


def test_train_and_create_model_do_not_need_scipy() -> None:
    code = ("import sys; sys.modules.update(dict.fromkeys(['scipy', 'scipy.stats', 'scipy.optimize']))\n"
            "import vitlab, vitlab.commands.train, vitlab.train.engine\n"
            "vitlab.create_model('vit_mnist')\n"
            "assert 'vitlab.experiments.stats' not in sys.modules, 'train imports the statistics'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
