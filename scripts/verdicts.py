"""The verdicts of docs/findings.md, computed from the committed run records under docs/results/runs/.

A thin list of the page's claims (:data:`CLAIMS`) over :func:`vitlab.experiments.verdict.compare_runs`'s pieces
(:mod:`vitlab.experiments.stats`): one row per claim, the difference between two arms (in accuracy points, or a
diagnostic's unit) signed so that positive is the direction the paper claims, its 95 % interval, the test, p, the
runs per arm and the minimal detectable effect at 80 % power of that design, with the run (seed) as the unit: a
paired t over per-seed differences where both arms have the same seeds, Welch's t over runs otherwise. The claims
are one family: Benjamini-Hochberg q-values and false-coverage-rate adjusted intervals (Benjamini and Yekutieli
2005) decide the verdict (:func:`vitlab.experiments.stats.decide_family`; the rule is stated on the page):

- a difference is *reproduced* when its q is at most 0.05 and the effect is on the paper's side, *contradicted* when
  it is on the other side, *undecided* otherwise;
- an "as good as" claim (TOST within the margin of :data:`CLAIMS`) is reproduced when its TOST q is at most 0.05,
  contradicted when its adjusted interval lies wholly outside the margin;
- a "no worse than" claim (non-inferiority, margin m) is reproduced when the one-sided test of ``effect > -m`` has
  q at most 0.05, contradicted when its adjusted interval lies wholly below -m.

An arm written ``STUDY/PREFIX@best`` is the learning rate whose runs have the lowest mean final validation loss
(never chosen on the test set); the ``lr_sens`` measure is each seed's LR sensitivity over the study's shared grid
(:func:`lr_sensitivities`; :func:`vitlab.experiments.lr_sensitivity.lr_sensitivity`, the study's own definition).
Arms with one run so far get their effect and *undecided*, no interval. A claim that names the runs its design plans
per arm (``Claim.runs``, section 10) is *pending* until both arms have finished them: no effect, interval or p-value
from an arm short of its runs, so the family's correction leaves it out; its ``seeds`` cell shows the runs finished per
arm and the runs planned (``2/1 of 5``: two runs of the first arm, one of the second, five planned each;
``0/0 of 5`` before any). Section 10's drop-path controls are run for the best arm, chosen on validation
accuracy once phase 2 ends (:func:`best_arm`). ``runs_to_decide`` is the runs per arm at which the MDE, at the
spread measured, would reach the observed effect (for equivalence: half the margin), at alpha 0.05 for that claim
alone; ``> 50`` when even 50 would not. Every row of sections 7 and 8 (short proxies) has the ``standing``
"proxy"; where section 10 answers the same question at the recipe's budget (:data:`AT_BUDGET`, named in
``at_budget``) and has decided, the proxy row is "confirmed" or "superseded" by it (:func:`standing`).

    python scripts/verdicts.py                 # write docs/results/verdicts.csv
    python scripts/verdicts.py --check         # exit 1 when the CSV differs from the records
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from vitlab.experiments import stats, verdict

if str(Path(__file__).resolve().parent) not in sys.path:  # records_csv beside this script, also loaded by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from records_csv import csv_main, csv_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "results" / "runs"
OUT = ROOT / "docs" / "results" / "verdicts.csv"
COLUMNS = ["id", "part", "section", "claim", "comparison", "unit", "effect", "ci_low", "ci_high", "p", "q",
           "adj_ci_low", "adj_ci_high", "test", "seeds", "mde", "margin", "verdict", "runs_to_decide", "standing",
           "at_budget"]


class NoRuns(LookupError):
    """An arm has no finished run (yet)."""


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    claim: str
    a: str  # STUDY/RUN-PREFIX of the arm the paper says is larger
    b: str
    measure: str = "acc"  # acc | max_logit | cv_attn | cv_mlp | lr_sens (b - a: lower is the claim) | similar_share
    margin: float = 0.0  # > 0: an "as good as" claim, TOST within this margin
    noninferior: bool = False  # with a margin: "no worse than" (a one-sided claim): the rule on the interval + margin
    runs: int = 0  # > 0: the runs per arm the design plans; until both arms have finished them the claim is pending

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
    Claim("ema-0.99", "4.6", "an EMA of the weights (decay 0.99) helps", "sweep_ema_decay/ema_decay=0.99",
          "sweep_ema_decay/ema_decay=0"),
    Claim("ema-0.999", "4.6", "an EMA of the weights (decay 0.999) helps", "sweep_ema_decay/ema_decay=0.999",
          "sweep_ema_decay/ema_decay=0"),
    Claim("lr-2e-3-1e-3", "4.7", "the recipe's lr 2e-3 beats 1e-3", "sweep_lr/lr=0.002", "sweep_lr/lr=0.001"),
    Claim("lr-2e-3-4e-3", "4.7", "the recipe's lr 2e-3 beats 4e-3", "sweep_lr/lr=0.002", "sweep_lr/lr=0.004"),
    Claim("batch-64-32", "4.8", "the recipe's batch 64 beats 32", "sweep_batch_size/batch_size=64",
          "sweep_batch_size/batch_size=32"),
    Claim("batch-64-128", "4.8", "the recipe's batch 64 beats 128", "sweep_batch_size/batch_size=64",
          "sweep_batch_size/batch_size=128"),
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
    Claim("collapse-36-12", "5.4", "the plain ViT's attention collapses with depth: a larger share of its blocks has a "
          "similar block (DeepViT's ratio, cosine above 0.9) at 36 blocks than at 12", "depth/vit_depth36",
          "depth/vit_depth12", measure="similar_share"),
    Claim("deepvit-vit-24-w128", "5.4", "DeepViT beats the plain ViT at 24 blocks (width 128)",
          "depth_dim128/deepvit_depth24", "depth_dim128/vit_depth24"),
    Claim("deepvit-24-12-w128", "5.4", "DeepViT gains from depth: 24 beats 12 blocks (width 128)",
          "depth_dim128/deepvit_depth24", "depth_dim128/deepvit_depth12"),
    # Section 7, the learning-rate sensitivity study (3-epoch proxy runs): each arm at its own best learning rate,
    # chosen on the validation loss (ARM@best), or the LR sensitivity of each seed over the whole grid (lr_sens)
    Claim("ls-vit-48-lr", "7", "LayerScale beats the plain ViT at 48 blocks, each at its best learning rate",
          "lr_sensitivity/layerscale_depth48@best", "lr_sensitivity/vit_depth48@best"),
    Claim("cait-vit-48-lr", "7", "CaiT beats the plain ViT at 48 blocks, each at its best learning rate",
          "lr_sensitivity/cait_depth48@best", "lr_sensitivity/vit_depth48@best"),
    Claim("deepvit-vit-48-lr", "7", "DeepViT beats the plain ViT at 48 blocks, each at its best learning rate",
          "lr_sensitivity/deepvit_depth48@best", "lr_sensitivity/vit_depth48@best"),
    Claim("tfixup-vit-12-lr", "7", "T-Fixup trains 12 blocks without normalisation no worse than the pre-norm ViT, "
          "each at its best learning rate (non-inferiority margin 1 point)", "lr_sensitivity/tfixup_depth12@best",
          "lr_sensitivity/vit_depth12@best", margin=1.0, noninferior=True),
    Claim("fixup-vit-24-lr", "7", "Fixup trains 24 blocks without normalisation no worse than the pre-norm ViT, each "
          "at its best learning rate (non-inferiority margin 1 point)", "lr_sensitivity/fixup_depth24@best",
          "lr_sensitivity/vit_depth24@best", margin=1.0, noninferior=True),
    Claim("ls-sens-48", "7", "LayerScale widens the range of learning rates at 48 blocks: lower LR sensitivity than "
          "the plain ViT", "lr_sensitivity/layerscale_depth48", "lr_sensitivity/vit_depth48", measure="lr_sens"),
    Claim("cait-sens-48", "7", "CaiT widens the range of learning rates at 48 blocks: lower LR sensitivity than the "
          "plain ViT", "lr_sensitivity/cait_depth48", "lr_sensitivity/vit_depth48", measure="lr_sens"),
    Claim("vit-logit-lr", "7", "attention logits grow with the learning rate: the plain ViT's largest logit at 48 "
          "blocks is higher at lr 1e-2 than at 2e-3", "lr_sensitivity/vit_depth48_lr0.01",
          "lr_sensitivity/vit_depth48_lr0.002", measure="max_logit"),
    Claim("vit-sens-depth", "7", "the plain ViT's LR sensitivity grows with depth: lower at 6 blocks than at 48",
          "lr_sensitivity/vit_depth6", "lr_sensitivity/vit_depth48", measure="lr_sens"),
    # section 8: full Fashion-MNIST (54,000 / 6,000 validation / 10,000 test), each variant and depth at its best
    # rate of section 7; arms share seeds and the 10,000 test images, so every row is paired per image
    Claim("fashion-ls-vit-24", "8", "LayerScale beats the plain ViT at 24 blocks on Fashion-MNIST, each at its best "
          "learning rate", "depth_fashion/layerscale_depth24", "depth_fashion/vit_depth24"),
    Claim("fashion-ls-vit-24-same-lr", "8", "LayerScale beats the plain ViT at 24 blocks on Fashion-MNIST at the same "
          "learning rate (2e-3, the ViT's)", "depth_fashion_same_lr/layerscale_depth24", "depth_fashion/vit_depth24"),
    Claim("fashion-ls-vit-12", "8", "LayerScale beats the plain ViT at 12 blocks on Fashion-MNIST, each at its best "
          "learning rate", "depth_fashion/layerscale_depth12", "depth_fashion/vit_depth12"),
    Claim("fashion-ls-24-6", "8", "depth pays off with LayerScale: 24 blocks beat 6 on Fashion-MNIST",
          "depth_fashion/layerscale_depth24", "depth_fashion/layerscale_depth6"),
    Claim("fashion-ls-24-12", "8", "depth pays off with LayerScale: 24 blocks beat 12 on Fashion-MNIST",
          "depth_fashion/layerscale_depth24", "depth_fashion/layerscale_depth12"),
    Claim("fashion-vit-12-24", "8", "the plain ViT saturates with depth: 24 blocks fall short of 12 on Fashion-MNIST",
          "depth_fashion/vit_depth12", "depth_fashion/vit_depth24"),
)


# Section 10, the rate x depth study at the recipe's budget: phase 1 (depth_budget_grid: every arm and depth at every
# rate, seed 0; depth_budget_wortsman: vit and qknorm at 6 and 24 blocks, seeds 0-2) and phase 2 (depth_budget: each
# cell at its best rate, 5 seeds), then the controls. A claim is pending until both its arms have the runs the design
# plans (Claim.runs).
BUDGET_ARMS = ("vit", "qknorm", "layerscale", "cait", "deepvit")
BUDGET_NAMES = {"vit": ("vit", "the plain ViT"), "qknorm": ("qk", "QK-layernorm"),
                "layerscale": ("ls", "LayerScale"), "cait": ("cait", "CaiT"), "deepvit": ("deepvit", "DeepViT")}
BUDGET_SEEDS = 5
BEST = "{best}"  # in a claim: the arm chosen by best_arm; until it is chosen the claim is pending
BEST_PENDING = "the best arm (chosen when phase 2 ends)"


def _budget_claims() -> tuple[Claim, ...]:
    out = []
    for a in BUDGET_ARMS:
        short, name = BUDGET_NAMES[a]
        for d in (6, 12):
            out.append(Claim(f"budget-{short}-24-{d}", "10", f"depth pays off for {name}: 24 blocks beat {d}",
                             f"depth_budget/{a}_depth24", f"depth_budget/{a}_depth{d}", runs=BUDGET_SEEDS))
    for d in (6, 12, 24):
        for a in BUDGET_ARMS[1:]:
            short, name = BUDGET_NAMES[a]
            out.append(Claim(f"budget-{short}-vit-{d}", "10", f"{name} beats the plain ViT at {d} blocks, each at its "
                             "own best rate", f"depth_budget/{a}_depth{d}", f"depth_budget/vit_depth{d}",
                             runs=BUDGET_SEEDS))
    out += [Claim("budget-vit-sens-depth", "10", "the plain ViT's LR sensitivity grows with depth: lower at 6 blocks "
                  "than at 24 (Wortsman et al. 2023)", "depth_budget_wortsman/vit_depth6",
                  "depth_budget_wortsman/vit_depth24", measure="lr_sens", runs=3),
            Claim("budget-qk-sens-24", "10", "QK-layernorm lowers the LR sensitivity at 24 blocks (Wortsman et al. "
                  "2023)", "depth_budget_wortsman/qknorm_depth24", "depth_budget_wortsman/vit_depth24",
                  measure="lr_sens",
                  runs=3)]
    for d in (6, 12, 24):  # the same-rate control: each arm at the ViT's best rate
        for a in BUDGET_ARMS[1:]:
            short, name = BUDGET_NAMES[a]
            out.append(Claim(f"budget-{short}-vit-{d}-same-lr", "10", f"{name} beats the plain ViT at {d} blocks at "
                             "the ViT's rate", f"depth_budget_same_rate/{a}_depth{d}", f"depth_budget/vit_depth{d}",
                             runs=BUDGET_SEEDS))
    out += [Claim("budget-dp-rule-24", "10", f"uniform drop-path 0.1 as good as linear 0.1 at 24 blocks for {BEST} "
                  "(margin 0.5 points)", f"depth_budget_dp_uniform/{BEST}_depth24",
                  f"depth_budget_dp_linear/{BEST}_depth24", margin=0.5, runs=BUDGET_SEEDS),
            # the design's control is drop-path 0 against both rules (stated before phase 4 ran)
            Claim("budget-dp-0-uniform-24", "10", f"drop-path 0 as good as uniform 0.1 at 24 blocks for {BEST} "
                  "(margin 0.5 points)", f"depth_budget/{BEST}_depth24", f"depth_budget_dp_uniform/{BEST}_depth24",
                  margin=0.5, runs=BUDGET_SEEDS),
            Claim("budget-dp-0-24", "10", f"drop-path 0 as good as linear 0.1 at 24 blocks for {BEST} (margin 0.5 "
                  "points)", f"depth_budget/{BEST}_depth24", f"depth_budget_dp_linear/{BEST}_depth24", margin=0.5,
                  runs=BUDGET_SEEDS)]
    return tuple(out)


CLAIMS = CLAIMS + _budget_claims()

# Sections 7 and 8 are short proxies (168 steps of mnist-5k; 3 epochs of Fashion-MNIST), so every row of theirs is a
# "proxy" row. Where section 10 asks the same question at the recipe's budget, its claim answers it and replaces the
# proxy's where the two conflict: {proxy claim: (section-10 claim, +1 stated the same way round, -1 the reverse)}.
# The 48-block rows of section 7 have no counterpart (section 10 stops at 24 blocks), nor do Fixup and T-Fixup (not
# arms of section 10); the plain ViT's "sensitivity grows with depth" is asked there between 6 and 24 blocks.
PROXY_SECTIONS = ("7", "8")
AT_BUDGET = {
    "vit-sens-depth": ("budget-vit-sens-depth", 1),
    "fashion-ls-vit-24": ("budget-ls-vit-24", 1),
    "fashion-ls-vit-24-same-lr": ("budget-ls-vit-24-same-lr", 1),
    "fashion-ls-vit-12": ("budget-ls-vit-12", 1),
    "fashion-ls-24-6": ("budget-ls-24-6", 1),
    "fashion-ls-24-12": ("budget-ls-24-12", 1),
    "fashion-vit-12-24": ("budget-vit-24-12", -1),  # "24 falls short of 12" against "24 beats 12"
}
PROXY, CONFIRMED, SUPERSEDED = "proxy", "proxy, confirmed at the budget", "proxy, superseded at the budget"
BUDGET = "recipe's budget"  # the standing of part II's other rows (sections 5 and 10: the recipe's 50 epochs)
LATE_SECTIONS = ("7", "8", "10")  # studies that may still be running: an arm without runs reads "not run yet"
PENDING = "pending"  # the verdict of a claim whose arms have not finished the runs its design plans


def run_dirs(arm: str, runs: Path = RUNS) -> list[Path]:
    """The run folders of ``STUDY/PREFIX`` (``PREFIX_seed=N`` or ``PREFIX_seedN``); ``STUDY/PREFIX@best``: those of
    the learning rate whose runs have the lowest mean final validation loss (:func:`best_lr`)."""
    if arm.endswith("@best"):
        study, prefix = arm[: -len("@best")].split("/", 1)
        return run_dirs(f"{study}/{prefix}_lr{best_lr(runs / study, prefix):g}", runs)
    from vitlab.errors import DataError
    from vitlab.experiments.verdict import run_folders

    study, prefix = arm.split("/", 1)
    try:  # the rule of `vitlab verdict STUDY/PREFIX`; a study none of whose runs is kept yet has no runs
        return run_folders(runs / study / prefix)
    except DataError as exc:
        raise NoRuns(str(exc)) from None


RATE_RUN = re.compile(r"(.+)_lr([0-9.e+-]+)_seed(\d+)")  # CELL_lrLR_seedN: a learning-rate study's run


def study_rows(study: Path) -> tuple[list[dict], float]:
    """The rows ``vitlab lr-sensitivity`` reads of a learning-rate sensitivity study's finished runs
    ``CELL_lrLR_seedN`` (``variant``: the cell's run prefix, ``depth`` 0, ``lr``, ``seed``, ``val_loss``: the final
    validation loss, ``diverged``), and the uniform guess's loss ``L0`` that caps them."""
    if not study.is_dir():
        raise NoRuns(f"no study folder {study} (yet)")
    # the study's class count from any run's config (a run that diverged in its first epoch saved none)
    configs = sorted(study.glob("*/config.json"))
    if not configs:
        raise ValueError(f"no run under {study} kept its config.json; restore the records (findings_tables.py "
                         "--keep-runs)")
    classes = json.loads(configs[0].read_text())["model"]["num_classes"]
    rows = []
    for run in sorted(study.iterdir()):
        m = RATE_RUN.fullmatch(run.name)
        if not m or not (run / "summary.json").is_file():
            continue
        summary = json.loads((run / "summary.json").read_text())
        rows.append({"variant": m.group(1), "depth": 0, "lr": float(m.group(2)), "seed": int(m.group(3)),
                     "val_loss": summary.get("final_val_loss", math.nan), "diverged": summary.get("diverged") is True})
    return rows, math.log(classes)


def study_losses(study: Path) -> dict[str, dict[float, dict[int, float]]]:
    """``{cell: {lr: {seed: capped final validation loss}}}`` of every finished run ``CELL_lrLR_seedN`` of a
    learning-rate sensitivity study (a diverged run, or one above a uniform guess's loss, counts as that loss)."""
    return _cells(*study_rows(study))


def _cells(rows: list[dict], l0: float) -> dict[str, dict[float, dict[int, float]]]:
    """:func:`study_losses` of the rows :func:`study_rows` read."""
    from vitlab.experiments.lr_sensitivity import capped_loss

    out: dict[str, dict[float, dict[int, float]]] = {}
    for r in rows:
        out.setdefault(r["variant"], {}).setdefault(r["lr"], {})[r["seed"]] = capped_loss(r, l0)
    return out


def lr_runs(study: Path, prefix: str) -> dict[float, dict[int, float]]:
    """``{lr: {seed: capped final validation loss}}`` of the runs ``PREFIX_lrLR_seedN`` of a learning-rate
    sensitivity study (:func:`study_losses`)."""
    losses = study_losses(study).get(prefix)
    if not losses:
        raise NoRuns(f"no finished run {prefix}_lr*_seed* under {study}")
    return losses


def best_lr(study: Path, prefix: str) -> float:
    """The learning rate of ``PREFIX`` whose runs have the lowest mean final validation loss (never the test set)."""
    losses = lr_runs(study, prefix)
    return min(losses, key=lambda lr: (statistics.fmean(losses[lr].values()), lr))


def study_grid(cells: dict[str, dict[float, dict[int, float]]]) -> list[float]:
    """The grid a study's cells share: the intersection over its cells (the run prefixes of :func:`study_losses`) of
    the rates each has finished at any seed. Once every cell has run the ``--lrs`` it was given, that is this list;
    a rate one cell added beyond the grid's edge (to bracket its optimum) is not in it."""
    rates = [set(c) for c in cells.values()]
    return sorted(set.intersection(*rates)) if rates else []


def lr_sensitivities(arm: str, runs: Path = RUNS) -> dict[int, float]:
    """``{seed: LR sensitivity}`` of ``STUDY/PREFIX`` for each seed that finished every rate of its cell's curve (the
    rates any run of ``PREFIX`` finished: the study's shared grid, :func:`study_grid`, and any rate the cell added
    beyond the grid's edge): ``vitlab lr-sensitivity``'s own
    :func:`vitlab.experiments.lr_sensitivity.seed_sensitivities` on the runs' losses, so the rule of which seeds
    count and :func:`~vitlab.experiments.lr_sensitivity.lr_sensitivity` ``(curve, grid)`` (the mean over the grid of
    the seed's capped loss minus its minimum over the whole curve) are written once. Where every cell has the same
    rates (section 7) that is the mean over the cell's own curve."""
    from vitlab.experiments.lr_sensitivity import seed_sensitivities

    study, prefix = arm.split("/", 1)
    rows, l0 = study_rows(runs / study)
    cells = _cells(rows, l0)
    if not cells.get(prefix):
        raise NoRuns(f"no finished run {prefix}_lr*_seed* under {runs / study}")
    grid = study_grid(cells)
    if not grid:
        return {}
    return seed_sensitivities([r for r in rows if r["variant"] == prefix], l0, grid).get((prefix, 0), {})


UNITS = {"acc": "points", "similar_share": "share of blocks", "lr_sens": "nats", "max_logit": "logit"}


def arm_values(arm: str, what: str, runs: Path = RUNS) -> dict[int, float]:
    """``{seed: value}`` of an arm: each seed's LR sensitivity, or each run's :func:`vitlab.experiments.verdict.measure`
    (a run without a complete record is refused by name)."""
    if what == "lr_sens":
        return lr_sensitivities(arm, runs)
    out = {}
    for run in run_dirs(arm, runs):
        out[verdict.seed_of(run)] = verdict.measure(run, what)
    return out


def best_arm(runs: Path = RUNS) -> str | None:
    """Section 10's best arm, chosen by rule and never on the test set: the arm of :data:`BUDGET_ARMS` with the
    highest mean final validation accuracy (``final_val_acc`` of each run's summary.json) at 24 blocks over phase 2's
    seeds (``depth_budget/ARM_depth24``); ties go to the earlier arm. None until every arm has its
    :data:`BUDGET_SEEDS` runs there."""
    means = {}
    for a in BUDGET_ARMS:
        try:
            values = arm_values(f"depth_budget/{a}_depth24", "final_val_acc", runs)
        except NoRuns:
            return None
        if len(values) < BUDGET_SEEDS:
            return None
        means[a] = statistics.fmean(values.values())
    return max(BUDGET_ARMS, key=lambda a: means[a])


def resolve(claim: Claim, best: str | None) -> Claim:
    """``claim`` with :data:`BEST` replaced by the arm :func:`best_arm` chose; while none is chosen, its text names
    :data:`BEST_PENDING` and its arms keep :data:`BEST` (so the claim is pending)."""
    if BEST not in claim.claim + claim.a + claim.b or best is None:
        return replace(claim, claim=claim.claim.replace(BEST, BEST_PENDING))
    text = f"the best arm, {BUDGET_NAMES[best][1]} (highest mean validation accuracy at 24 blocks)"
    return replace(claim, claim=claim.claim.replace(BEST, text), a=claim.a.replace(BEST, best),
                   b=claim.b.replace(BEST, best))


def pending(claim: Claim, n_a: int, n_b: int) -> stats.Result:
    """A claim whose arms have ``n_a`` and ``n_b`` of the :attr:`Claim.runs` its design plans: no effect, no interval
    and no p-value from an arm short of its runs (so the family's correction leaves it out), the verdict
    :data:`PENDING`."""
    nan = math.nan
    return stats.Result(nan, nan, nan, nan, f"pending: {claim.runs} runs per arm planned", n_a, n_b, nan, "",
                        PENDING, margin=claim.margin)


def evaluate_result(claim: Claim, runs: Path = RUNS) -> stats.Result:
    """The comparison of one claim, alone (before the family's correction); :func:`pending` while an arm has fewer
    finished runs than the claim's ``runs`` (or its :data:`BEST` arm is not chosen yet)."""
    lower = claim.measure.startswith("cv") or claim.measure == "lr_sens"  # lower is the claim: b - a
    if BEST in claim.a + claim.b:
        return pending(claim, 0, 0)
    values, missing = [], False
    for arm in (claim.a, claim.b):
        try:
            values.append(arm_values(arm, claim.measure, runs))
        except NoRuns:  # a study still running: the claim is on the page, its runs are not yet
            if claim.section not in LATE_SECTIONS:
                raise
            values.append({})
            missing = True
    a, b = values
    if lower:
        a, b = b, a
    if claim.runs and min(len(a), len(b)) < claim.runs:
        return pending(claim, len(a), len(b))
    if missing:
        return stats.compare([], [], margin=claim.margin, noninferior=claim.noninferior)
    paired = set(a) == set(b) and len(a) >= 2
    return stats.compare(a, b, paired=paired, margin=claim.margin, noninferior=claim.noninferior)


def _row(claim: Claim, r: stats.Result) -> dict[str, str]:
    lower = claim.measure.startswith("cv") or claim.measure == "lr_sens"
    cells = r.row()
    return {"id": claim.id, "part": claim.part, "section": claim.section, "claim": claim.claim,
            "comparison": f"{claim.b} - {claim.a}" if lower else f"{claim.a} - {claim.b}",
            "unit": UNITS.get(claim.measure, "CV"), **{k: cells[k] for k in (
                "effect", "ci_low", "ci_high", "p", "q", "adj_ci_low", "adj_ci_high", "test")},
            "seeds": f"{r.n_a}/{r.n_b} of {claim.runs}" if r.verdict == PENDING else cells["runs"], "mde": cells["mde"],
            "margin": cells["margin"], "verdict": r.verdict,
            "runs_to_decide": r.runs_to_decide}


def standing(row: dict[str, str], by_id: dict[str, dict[str, str]]) -> tuple[str, str]:
    """``(standing, at_budget)`` of a verdict row. A row of :data:`PROXY_SECTIONS` is :data:`PROXY`; where section 10
    answers its question (:data:`AT_BUDGET`) and has decided (reproduced or contradicted), it is :data:`CONFIRMED`
    when the two verdicts agree, read the same way round, else :data:`SUPERSEDED` (section 10's row replaces it; an
    undecided proxy is superseded by a decided answer). ``at_budget`` names section 10's claim and its own verdict
    (``budget-ls-vit-24: pending``). Part II's other rows were trained to the recipe's budget (:data:`BUDGET`); part
    I's rows have neither."""
    if row["section"] not in PROXY_SECTIONS:
        return (BUDGET if row["part"] == "II" else ""), ""
    if row["id"] not in AT_BUDGET:
        return PROXY, ""
    other, sign = AT_BUDGET[row["id"]]
    answer = by_id.get(other)
    if answer is None:  # a family without section 10's claim (one claim evaluated alone)
        return PROXY, other
    said = answer["verdict"]
    flip = {stats.REPRODUCED: stats.CONTRADICTED, stats.CONTRADICTED: stats.REPRODUCED}
    if said not in flip:
        return PROXY, f"{other}: {said}"
    read = said if sign > 0 else flip[said]
    return (CONFIRMED if read == row["verdict"] else SUPERSEDED), f"{other}: {said}"


def evaluate(claim: Claim, runs: Path = RUNS) -> dict[str, str]:
    """The verdict row of ``claim`` alone (as if it were the page's only claim)."""
    return rows([claim], runs)[0]


def rows(claims: tuple[Claim, ...] | list[Claim] = CLAIMS, runs: Path = RUNS) -> list[dict[str, str]]:
    """The rows of ``claims``, decided as one family (:data:`BEST` resolved by :func:`best_arm`)."""
    best = best_arm(runs) if any(BEST in c.a + c.b for c in claims) else None
    claims = [resolve(c, best) for c in claims]
    results = stats.decide_family([evaluate_result(c, runs) for c in claims])
    out = [_row(c, r) for c, r in zip(claims, results)]
    by_id = {r["id"]: r for r in out}
    for r in out:
        r["standing"], r["at_budget"] = standing(r, by_id)
    return out


def table(runs: Path = RUNS) -> str:
    """The verdicts CSV text."""
    with warnings.catch_warnings():  # scipy warns on arms that are nearly constant (the diverged runs at 10 %)
        warnings.simplefilter("ignore", RuntimeWarning)
        return csv_text(COLUMNS, rows(CLAIMS, runs))


def main(argv: list[str] | None = None) -> int:
    return csv_main(argv, description=__doc__.split("\n")[0], table=table, runs=RUNS, out=OUT, what="verdicts CSV",
                    script="verdicts.py", written=lambda text: f"{len(CLAIMS)} verdicts")

if __name__ == "__main__":
    raise SystemExit(main())
