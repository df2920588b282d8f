"""The docs name each machine one way: an AMD EPYC's microarchitecture follows from its ``lscpu`` family and model
(family 25 model 1 is Zen 3, model 17 is Zen 4), so no page calls one CPU by the other's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ZEN = {(25, 1): 3, (25, 17): 4}  # the AMD EPYCs the project has met: Milan (Zen 3), Genoa (Zen 4)
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "family 25 model 17 (Zen 4", "cpu family 25 model 1 = Zen 3", "Zen 3, family 25 model 1"
NAMED = re.compile(r"family (\d+),? model (\d+)\)?\s*(?:\(|=|,)?\s*Zen (\d)"
                   r"|Zen (\d), (?:cpu )?family (\d+),? model (\d+)")


def named(text: str) -> list[tuple[int, int, int]]:
    out = []
    for m in NAMED.finditer(text):
        fam, mod, zen = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(5), m.group(6), m.group(4))
        out.append((int(fam), int(mod), int(zen)))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_cpu_is_called_by_the_name_its_family_and_model_give(page: Path) -> None:
    wrong = [f"family {f} model {m} called Zen {z} (it is Zen {ZEN[f, m]})"
             for f, m, z in named(page.read_text()) if (f, m) in ZEN and ZEN[f, m] != z]
    assert not wrong, f"{page.name}: {wrong}"


def test_the_rule_reads_each_way_of_writing_it() -> None:
    text = ("on family 25 model 17 (Zen 3, ...); (cpu family 25 model 1 = Zen 4); "
            "a 2-core AMD EPYC (Zen 3, family 25 model 1")
    assert named(text) == [(25, 17, 3), (25, 1, 4), (25, 1, 3)]
