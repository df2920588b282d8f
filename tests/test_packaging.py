"""Packaging: one version, a changelog that names it, and (slow) a wheel and sdist that install into a fresh venv
and run ``vitlab models`` from the installed copy, not from this source tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import vitlab
from vitlab.version import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # the oldest Python the package claims reads TOML with the backport (a dev dependency)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vitlab.version.__version__"}
    assert vitlab.__version__ == __version__ and re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    hits = [p for p in (ROOT / "src").rglob("*.py") if re.search(r"""__version__\s*=\s*['"]""", p.read_text())]
    assert hits == [ROOT / "src" / "vitlab" / "version.py"]


def test_changelog_names_this_version_and_the_extras_exist():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$",
                                                   text, re.M)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    from vitlab.train.tracking import LOGGERS, MODULE

    for name in LOGGERS[1:]:
        assert any(req.startswith(MODULE[name]) for req in extras[name]), name  # the extra the error names


def _source_copy(dest: Path) -> Path:
    skip = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__",
                                  ".pytest_cache", ".ruff_cache")
    shutil.copytree(ROOT, dest, ignore=skip)
    return dest


@pytest.mark.slow
def test_wheel_and_sdist_install_into_a_fresh_venv(tmp_path):
    pytest.importorskip("build")
    src, dist, venv = _source_copy(tmp_path / "src"), tmp_path / "dist", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing may come from the source tree
    # no isolation: the build backend (setuptools) of this environment, so the test runs offline; `python -m build`
    # with isolation (what a release runs) fetches setuptools from the index instead
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)], check=True,
                   env=env, capture_output=True, cwd=tmp_path)
    (wheel,) = dist.glob(f"vitlab-{__version__}-py3-none-any.whl")
    (sdist,) = dist.glob(f"vitlab-{__version__}.tar.gz")  # the wheel above was built from this sdist
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    packaged = {f"vitlab/{p.relative_to(ROOT / 'src' / 'vitlab').as_posix()}"
                for p in (ROOT / "src" / "vitlab").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert packaged <= names  # every file of the package, the sub-command modules found at run time included
    with tarfile.open(sdist) as t:
        members = {m.split("/", 1)[1] for m in t.getnames() if "/" in m}
    assert {"CHANGELOG.md", "README.md", "configs/vit_mnist_mnist5k.yaml", "docs/training.md"} <= members

    # a fresh venv that sees this environment's torch & co. through a .pth file (no download), but not vitlab;
    # without a pip (and setuptools) of its own, which would shadow this environment's: pip --python installs
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    bin_dir = venv / "bin"
    purelib = Path(subprocess.run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, env=env, capture_output=True, text=True).stdout.strip())
    (purelib / "zz_host_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    probe = subprocess.run([bin_dir / "python", "-c", "import vitlab"], env=env, capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0  # the host's (editable) vitlab is not visible: the next import is the wheel's
    subprocess.run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--no-index", "-q",
                    str(wheel)], check=True, env=env, capture_output=True)  # dependencies resolve offline
    where = subprocess.run([bin_dir / "python", "-c", "import vitlab; print(vitlab.__file__, vitlab.__version__)"],
                           check=True, env=env, capture_output=True, text=True, cwd=tmp_path).stdout.split()
    assert Path(where[0]).is_relative_to(purelib) and where[1] == __version__
    models = subprocess.run([bin_dir / "vitlab", "models", "vit_mnist"], check=True, env=env, capture_output=True,
                            text=True, cwd=tmp_path).stdout
    assert "vit_mnist" in models
    version = subprocess.run([bin_dir / "vitlab", "--version"], check=True, env=env, capture_output=True, text=True)
    assert version.stdout.strip() == f"vitlab {__version__}"
