"""The diagnostics of one depth-study run: attention collapse (Zhou et al. 2021, DeepViT: cross-layer similarity of
the attention maps, similar-block counts), residual ratios per block (Touvron et al. 2021, CaiT) and the per-layer
probes (:mod:`vitlab.analysis.probes`: token similarity, effective rank, artifact tokens, entropy, max logit) of
its checkpoint on the diagnostics images, saved as ``diagnostics.json`` beside it, and the numbers the study tables
from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.errors import CheckpointError

# what diagnostics.json holds; an older one is recomputed (or, without weights, kept). 2: pre-mix maps of talking
# heads too (1: re-attention's); 3: the entropy of the softmax maps per layer; 4: the per-layer probes
DIAG_VERSION = 4


def _read_back(path: Path) -> dict[str, Any] | None:
    """The diagnostics a run folder kept; None when the file is damaged (not JSON, nested too deeply, not an object,
    over 16 MiB), so that they are computed again."""
    from vitlab.checkpoint.textfiles import read_json

    try:
        data = read_json(path, fix="", error=CheckpointError)
    except CheckpointError:
        return None
    return data if isinstance(data, dict) else None


def kept_diagnostics(run_dir: Path, threshold: float, num_images: int, *, current: bool = False
                     ) -> dict[str, Any] | None:
    """The diagnostics ``run_dir`` kept (``diagnostics.json``) when they were made at ``threshold`` on
    ``num_images`` images, of any version (``current``: of this version only, which :func:`diagnose` reads back
    without loading the weights); None when there are none, they are damaged or were made at other settings."""
    path = run_dir / "diagnostics.json"
    diag = _read_back(path) if path.is_file() else None
    if diag is None or diag.get("threshold") != threshold or diag.get("num_images") != num_images:
        return None
    return None if current and diag.get("version") != DIAG_VERSION else diag


def diagnose(run_dir: Path, images: Any, labels: Any, classes: list[str], mean: tuple, std: tuple, *,
             threshold: float, batch_size: int = 32, full_report: bool = False) -> dict[str, Any]:
    """Attention collapse and residual ratios of the run's checkpoint on ``images`` (uint8 test images), saved
    as ``run_dir/diagnostics.json`` and read back when it exists with the same settings. ``full_report``
    also writes the whole ``vitlab analyze`` report (attention maps, rollout...) into ``run_dir/analysis``.

    ``collapse`` compares the maps multiplied with the values; for re-attention (DeepViT) and talking heads
    (CaiT) those are mixed over heads (re-attention's also normalised), not probability rows, so
    ``collapse_pre_mix`` also compares their softmax maps before that mix (empty for models without either)."""
    import torch

    from vitlab.analysis import SimilarityMeter, analyze_model, attention_entropy, residual_ratios
    from vitlab.analysis.analyze import model_inputs
    from vitlab.analysis.collapse import is_probability_rows
    from vitlab.analysis.probes import probe_model
    from vitlab.checkpoint import load_model
    from vitlab.layers.attention import record_pre_mix
    from vitlab.models import VitlabModel
    from vitlab.writers import write_json

    old = None
    if not (full_report and not (run_dir / "analysis" / "index.html").is_file()):
        old = kept_diagnostics(run_dir, threshold, len(images))
        if old is not None and old.get("version") == DIAG_VERSION:
            return old
    try:
        model = load_model(run_dir).eval()
    except CheckpointError:
        if old is None:
            raise
        # a run restored from its committed record has no weights: its older diagnostics stay, the measures
        # added since read NaN
        return old
    if full_report:
        cmd = ["vitlab", "analyze", "--checkpoint", str(run_dir), "--output", str(run_dir / "analysis"),
               "--num-images", str(len(images)), "--threshold", f"{threshold:g}"]
        analyze_model(model, images, run_dir / "analysis", labels=labels, classes=classes, mean=mean, std=std,
                      threshold=threshold, batch_size=batch_size, command=cmd, title=f"Analysis of {run_dir.name}")
    x = model_inputs(model, images, mean, std)
    meter, pre_meter = SimilarityMeter(threshold), SimilarityMeter(threshold)
    entropy, entropy_layers = None, []
    with torch.no_grad():
        for chunk in x.split(batch_size):
            with record_pre_mix(model.modules()) as pre_mix:
                maps = model.attention_maps(chunk)
            meter.update(maps)
            if pre_mix:
                pre_meter.update(list(pre_mix))
            # the softmax maps: before the head mix where the model mixes after the softmax
            softmax = list(pre_mix) or maps
            layers = [i for i, m in enumerate(softmax) if m.shape[-2] == m.shape[-1] and is_probability_rows(m)]
            if layers:
                e = attention_entropy([softmax[i] for i in layers]) * chunk.shape[0]
                entropy, entropy_layers = (e if entropy is None else entropy + e), layers
    diag = {"version": DIAG_VERSION, "threshold": threshold, "num_images": len(images),
            "collapse": _collapse_rows(meter.compute()),
            "collapse_pre_mix": _collapse_rows(pre_meter.compute()) if pre_meter.count else [],
            "entropy": {"layers": entropy_layers,
                        "values": (entropy / len(images)).tolist() if entropy is not None else []},
            "residual_ratios": [r.row() for r in residual_ratios(model, x, batch_size=batch_size)],
            "probes": _json_rows(probe_model(model, x, batch_size=batch_size).rows())
            if isinstance(model, VitlabModel) else []}
    write_json(run_dir / "diagnostics.json", diag)
    return diag


def _json_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with NaN (a probe that does not apply, e.g. register mass without registers) as None (JSON null)."""
    return [{k: None if isinstance(v, float) and v != v else v for k, v in r.items()} for r in rows]


def _collapse_rows(groups: list[Any]) -> list[dict[str, Any]]:
    return [{"group": g.name, "along": g.along, "layers": g.layers, "mean_similarity": g.mean_off_diagonal(),
             "similar_blocks": g.similar.tolist(), "similarity": g.similarity.tolist()} for g in groups]


def _collapse_columns(groups: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    sa = next((g for g in groups if g["group"] == "self_attention"), None)
    n = len(sa["layers"]) if sa else 0
    similar = sa["similar_blocks"] if sa else []
    return {
        f"mean_similarity{suffix}": sa["mean_similarity"] if sa and n > 1 else float("nan"),
        f"layers_with_similar{suffix}": sum(1 for c in similar if c > 0),
        f"similar_fraction{suffix}": sum(1 for c in similar if c > 0) / n if n > 1 else float("nan"),
        f"mean_similar_blocks{suffix}": sum(similar) / n if n > 1 else float("nan"),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def diagnostic_columns(diag: dict[str, Any]) -> dict[str, Any]:
    """The per-run numbers of the study: self-attention collapse (of the recorded maps, and ``*_pre_mix`` of
    the softmax maps before the head mix of re-attention or talking heads: NaN without either) and
    residual-ratio summaries."""
    ratios = diag["residual_ratios"]
    sa_ratios = [r for r in ratios if r["kind"] == "self_attention"]
    attn = [r["attn_mean"] for r in sa_ratios]
    mlp = [r["mlp_mean"] for r in sa_ratios]
    return {
        **_collapse_columns(diag["collapse"]),
        **_collapse_columns(diag.get("collapse_pre_mix", []), "_pre_mix"),
        "attn_entropy": _mean(diag.get("entropy", {}).get("values", [])),
        "ratio_attn_mean": _mean(attn),
        "ratio_mlp_mean": _mean(mlp),
        "ratio_attn_last": attn[-1] if attn else float("nan"),
        "ratio_mlp_last": mlp[-1] if mlp else float("nan"),
        **probe_columns(diag.get("probes", [])),
    }


def probe_columns(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A run's probes in one number each (NaN without probes): the last block's token similarity, uncentred and
    centred effective rank and rank residual, the largest max logit of any block, the artifact tokens per image
    summed over the blocks (NaN where not measurable: too few patch tokens), and the attention mass those artifacts
    and the register tokens receive, averaged over the blocks. Rows of older records are read under the current
    names (``effective_rank`` was the centred rank)."""
    from vitlab.analysis.probes import current_names

    rows = [current_names(r) for r in rows]

    def col(name: str) -> list[float]:
        return [r[name] for r in rows if isinstance(r.get(name), int | float) and r[name] == r[name]]

    last = {k: v for k, v in rows[-1].items() if v is not None} if rows else {}
    logits = col("max_logit")
    artifacts = col("artifact_count")
    return {
        "probe_similarity_last": last.get("token_similarity", float("nan")),
        "probe_erank_uncentred_last": last.get("effective_rank_uncentred", float("nan")),
        "probe_erank_centred_last": last.get("effective_rank_centred", float("nan")),
        "probe_residual_last": last.get("rank_residual", float("nan")),
        "probe_max_logit": max(logits) if logits else float("nan"),
        "probe_artifacts": sum(artifacts) if artifacts else float("nan"),
        "probe_artifact_mass": _mean(col("artifact_mass_all")),
        "probe_artifact_mass_cls": _mean(col("artifact_mass_cls")),
        "probe_register_mass": _mean(col("register_mass_all")),
    }


DIAG_VALUES = ("mean_similarity", "similar_fraction", "mean_similar_blocks", "mean_similarity_pre_mix",
               "similar_fraction_pre_mix", "mean_similar_blocks_pre_mix", "attn_entropy", "ratio_attn_mean",
               "ratio_mlp_mean", "probe_similarity_last", "probe_erank_uncentred_last", "probe_erank_centred_last",
               "probe_residual_last", "probe_max_logit", "probe_artifacts", "probe_artifact_mass",
               "probe_artifact_mass_cls", "probe_register_mass")
