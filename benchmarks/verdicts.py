"""The verdicts of docs/findings.md, computed from the committed run records under docs/results/runs/.

One row per claim of the page (:data:`CLAIMS`): the difference between two arms (in accuracy points, or a
diagnostic's unit), signed so that positive is the direction the paper claims, its 95 % interval, the test, the
p-value, the runs per arm and the minimal detectable effect at 80 % power of that design
(:mod:`vitlab.analysis.stats`). The rule, applied here and nowhere by hand:

- a claim of a difference is *reproduced* when the interval excludes zero on the paper's side, *contradicted* when
  it excludes zero on the other side, *undecided* otherwise;
- an "as good as" claim is *reproduced* only when TOST shows equivalence within the margin stated in
  :data:`CLAIMS`, *contradicted* when the 95 % interval lies wholly outside the margin, *undecided* otherwise.

The recorded runs have no per-image predictions (they predate them), so every row uses Welch's t over the runs
(column ``test``). ``runs_to_decide`` is the number of runs per arm at which the MDE, at the spread measured, would
reach the observed effect (for equivalence: half the margin), from the noncentral-t power of
:func:`vitlab.analysis.stats.mde_welch`; ``> 50`` when even 50 would not (an effect near zero needs an
equivalence margin instead).

    python benchmarks/verdicts.py                 # write docs/results/verdicts.csv
    python benchmarks/verdicts.py --check         # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from vitlab.analysis import stats

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "verdicts.csv"
COLUMNS = ["id", "part", "section", "claim", "comparison", "unit", "effect", "ci_low", "ci_high", "p", "test",
           "seeds", "mde", "margin", "verdict", "runs_to_decide"]
MAX_RUNS = 50


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    claim: str
    a: str  # STUDY/RUN-PREFIX of the arm the paper says is larger
    b: str
    measure: str = "acc"  # acc | cv_attn | cv_mlp (b - a: lower is the claim) | similarity (a against 0.9)
    margin: float = 0.0  # > 0: an "as good as" claim, TOST within this margin

    @property
    def part(self) -> str:
        return "I" if int(self.section.split(".")[0]) <= 4 else "II"


CLAIMS = (
    Claim("embed-64-256", "2.1", "width 256 degrades accuracy against 64", "sweep_embed_dim/embed_dim=64",
          "sweep_embed_dim/embed_dim=256"),
    Claim("embed-64-128", "2.1", "64 is best: better than 128", "sweep_embed_dim/embed_dim=64",
          "sweep_embed_dim/embed_dim=128"),
    Claim("embed-64-32", "2.1", "64 is best: better than 32", "sweep_embed_dim/embed_dim=64",
          "sweep_embed_dim/embed_dim=32"),
    Claim("patch-4-14", "2.2", "finer patches see finer detail: patch 4 beats 14", "sweep_patch_size/patch_size=4",
          "sweep_patch_size/patch_size=14"),
    Claim("patch-7-14", "2.2", "patch 7 balances detail and cost: 7 beats 14", "sweep_patch_size/patch_size=7",
          "sweep_patch_size/patch_size=14"),
    Claim("depth-8-2", "2.3", "fewer blocks underfit: 8 beats 2", "sweep_depth/depth=8", "sweep_depth/depth=2"),
    Claim("depth-8-12", "2.3", "more blocks may overfit: 8 beats 12", "sweep_depth/depth=8", "sweep_depth/depth=12"),
    Claim("heads-8-1", "2.4", "more heads help: 8 beats 1", "sweep_num_heads/num_heads=8",
          "sweep_num_heads/num_heads=1"),
    Claim("heads-16-8", "2.4", "more heads help: 16 beats 8", "sweep_num_heads/num_heads=16",
          "sweep_num_heads/num_heads=8"),
    Claim("mlp-8-4", "2.5", "no gain beyond ratio 4: ratio 8 as good as 4 (margin 0.5 points)",
          "sweep_mlp_ratio/mlp_ratio=8", "sweep_mlp_ratio/mlp_ratio=4", margin=0.5),
    Claim("table1-own-ft", "3", "own ViT beats timm's ViT fine-tuned (10 epochs)", "table1/vit_mnist_scratch",
          "table1/timm-vit_tiny_patch16_224_finetune1"),
    Claim("table1-ft-scratch", "3", "pre-training helps timm's ViT (Fashion-MNIST weights, not ImageNet)",
          "table1/timm-vit_tiny_patch16_224_finetune1", "table1/timm-vit_tiny_patch16_224_scratch"),
    Claim("smoothing", "4.1", "label smoothing 0.1 helps", "ablation_label_smoothing/label_smoothing=0.1",
          "ablation_label_smoothing/label_smoothing=0"),
    Claim("augment", "4.2", "augmentation helps", "ablation_label_smoothing/label_smoothing=0.1",
          "ablation_no_augment/label_smoothing=0.1"),
    Claim("drop-path", "4.3", "stochastic depth 0.1 helps", "ablation_drop_path/drop_path=0.1",
          "ablation_drop_path/drop_path=0"),
    Claim("layer-decay", "4.4", "layer-wise lr decay 0.75 helps", "ablation_layer_decay/lr=0.002",
          "ablation_label_smoothing/label_smoothing=0.1"),
    Claim("conv-stem", "4.5", "a convolutional stem helps (patch 4)", "ablation_conv_stem/stem=conv",
          "ablation_conv_stem/stem=patch"),
    Claim("ls-vit-24", "5.1", "LayerScale beats the plain ViT at 24 blocks", "depth/layerscale_depth24",
          "depth/vit_depth24"),
    Claim("ls-vit-36", "5.1", "LayerScale beats the plain ViT at 36 blocks", "depth/layerscale_depth36",
          "depth/vit_depth36"),
    Claim("ls-36-6", "5.1", "LayerScale gains from depth: 36 beats 6 blocks", "depth/layerscale_depth36",
          "depth/layerscale_depth6"),
    Claim("cait-vit-24", "5.1", "CaiT (class attention, talking heads) beats the plain ViT at 24 blocks",
          "depth/cait_depth24", "depth/vit_depth24"),
    Claim("deepvit-vit-24", "5.1", "DeepViT beats the plain ViT at 24 blocks (width 64)", "depth/deepvit_depth24",
          "depth/vit_depth24"),
    Claim("deepvit-24-12", "5.1", "DeepViT gains from depth: 24 beats 12 blocks (width 64)", "depth/deepvit_depth24",
          "depth/deepvit_depth12"),
    Claim("ls-rezero-24", "5.1", "ReZero falls short of LayerScale at 24 blocks", "depth/layerscale_depth24",
          "depth/rezero_depth24"),
    Claim("ls-skipinit-24", "5.1", "SkipInit falls short of LayerScale at 24 blocks", "depth/layerscale_depth24",
          "depth/skipinit_depth24"),
    Claim("ls-fixup-24", "5.1", "Fixup falls short of LayerScale at 24 blocks (lr 2e-3 only)",
          "depth/layerscale_depth24", "depth/fixup_depth24"),
    Claim("ls-tfixup-12", "5.1", "T-Fixup falls short of LayerScale at 12 blocks (lr 2e-3 only; Huang et al. "
          "train 12-18 layers)", "depth/layerscale_depth12", "depth/tfixup_depth12"),
    Claim("ls-tfixup-24", "5.1", "T-Fixup falls short of LayerScale at 24 blocks (lr 2e-3 only)",
          "depth/layerscale_depth24", "depth/tfixup_depth24"),
    Claim("cv-mlp-36", "5.2", "LayerScale makes the MLP residual ratios more uniform at 36 blocks (CV lower)",
          "depth/layerscale_depth36", "depth/vit_depth36", measure="cv_mlp"),
    Claim("cv-attn-24", "5.2", "LayerScale makes the attention residual ratios more uniform at 24 blocks",
          "depth/layerscale_depth24", "depth/vit_depth24", measure="cv_attn"),
    Claim("dp-rule", "5.3", "uniform drop-path as good as linear at 24 blocks (margin 0.5 points; no drop-path-0 "
          "control)", "drop_path_rule/drop_path_rule=uniform", "drop_path_rule/drop_path_rule=linear", margin=0.5),
    Claim("collapse-36", "5.4", "the plain ViT's attention collapses at depth: 36-block mean similarity above 0.9",
          "depth/vit_depth36", "", measure="similarity"),
    Claim("deepvit-vit-24-w128", "5.4", "DeepViT beats the plain ViT at 24 blocks (width 128)",
          "depth_dim128/deepvit_depth24", "depth_dim128/vit_depth24"),
    Claim("deepvit-24-12-w128", "5.4", "DeepViT gains from depth: 24 beats 12 blocks (width 128)",
          "depth_dim128/deepvit_depth24", "depth_dim128/deepvit_depth12"),
)


def run_dirs(arm: str, runs: Path = RUNS) -> list[Path]:
    """The run folders of ``STUDY/PREFIX`` (``PREFIX_seed=N`` or ``PREFIX_seedN``)."""
    study, prefix = arm.split("/", 1)
    pattern = re.compile(rf"{re.escape(prefix)}_seed=?\d+")
    found = sorted(p for p in (runs / study).iterdir() if pattern.fullmatch(p.name) and (p / "summary.json").is_file())
    if not found:
        raise FileNotFoundError(f"no finished run {prefix}_seed* under {runs / study}")
    return found


def _cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def measure(run: Path, what: str) -> float:
    """One run's value: test accuracy in points, a residual-ratio CV or the mean cross-layer similarity."""
    if what == "acc":
        return 100 * json.loads((run / "summary.json").read_text())["final_test_acc"]
    diag = json.loads((run / "diagnostics.json").read_text())
    if what == "similarity":
        return next(c["mean_similarity"] for c in diag["collapse"] if c["group"] == "self_attention")
    branch = what.split("_")[1]
    return _cv([r[f"{branch}_mean"] for r in diag["residual_ratios"] if r["kind"] == "self_attention"])


def _runs_to_decide(target: float, sd: float) -> str:
    if not sd > 0:
        return ""
    for n in range(2, MAX_RUNS + 1):
        if stats.mde_welch(n, n, sd) <= target:
            return str(n)
    return f"> {MAX_RUNS}"


def evaluate(claim: Claim, runs: Path = RUNS) -> dict[str, str]:
    """The verdict row of ``claim`` from the run records under ``runs``."""
    a = [measure(r, claim.measure) for r in run_dirs(claim.a, runs)]
    unit = "points" if claim.measure == "acc" else ("CV" if claim.measure.startswith("cv") else "cosine")
    if claim.measure == "similarity":
        c = stats.one_sample(a, 0.9)
        sd, seeds, mde = statistics.stdev(a), str(len(a)), math.nan
        v = stats.verdict(c.ci_low, c.ci_high)
        comparison, decide = f"{claim.a} - 0.9", ""
    else:
        b = [measure(r, claim.measure) for r in run_dirs(claim.b, runs)]
        if claim.measure.startswith("cv"):  # lower CV is the claim: positive effect = b - a
            a, b = b, a
        c = stats.welch(a, b)
        sd = stats.pooled_sd(a, b)
        seeds = f"{len(a)}/{len(b)}"
        mde = stats.mde_welch(len(a), len(b), sd)
        comparison = f"{claim.b} - {claim.a}" if claim.measure.startswith("cv") else f"{claim.a} - {claim.b}"
        if claim.margin:
            v = stats.equivalence_verdict(stats.tost(a, b, claim.margin), c.ci_low, c.ci_high)
            target = claim.margin / 2
        else:
            v = stats.verdict(c.ci_low, c.ci_high)
            target = abs(c.effect)
        decide = _runs_to_decide(target, sd) if v == stats.UNDECIDED else ""
    test = c.test + (f" + TOST (margin {claim.margin:g})" if claim.margin else "")
    return {"id": claim.id, "part": claim.part, "section": claim.section, "claim": claim.claim,
            "comparison": comparison, "unit": unit, "effect": f"{c.effect:.4g}", "ci_low": f"{c.ci_low:.4g}",
            "ci_high": f"{c.ci_high:.4g}", "p": f"{c.p:.3g}", "test": test, "seeds": seeds,
            "mde": f"{mde:.3g}", "margin": f"{claim.margin:g}" if claim.margin else "", "verdict": v,
            "runs_to_decide": decide}


def table(runs: Path = RUNS) -> str:
    """The verdicts CSV text."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    with warnings.catch_warnings():  # scipy warns on arms that are nearly constant (the diverged runs at 10 %)
        warnings.simplefilter("ignore", RuntimeWarning)
        w.writerows(evaluate(c, runs) for c in CLAIMS)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=RUNS, help="the kept run records (docs/results/runs)")
    p.add_argument("--out", type=Path, default=OUT, help="the verdicts CSV (docs/results/verdicts.csv)")
    p.add_argument("--check", action="store_true", help="exit 1 when the CSV differs from what the records give")
    args = p.parse_args(argv)
    text = table(args.runs)
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        if not same:
            print(f"{args.out} differs from the run records; run benchmarks/verdicts.py", file=sys.stderr)
        return 0 if same else 1
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(args.out)
    print(f"wrote {args.out} ({len(CLAIMS)} verdicts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
