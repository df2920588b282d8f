"""Why one deep transformer trains and another does not: attention collapse, residual ratios, attention
maps and rollout, position-embedding similarity and the per-layer probes.

Pure functions on tensors (``cross_layer_similarity``, ``rollout``, ``pos_embed_similarity``, ...) work on
``model.attention_maps(x)`` / ``model.residual_ratios(x)`` of any vitlab model; ``analyze_model`` runs them
all and writes PNG + CSV + JSON + ``index.html`` (figures drawn by :mod:`vitlab.plots`, files written by
:mod:`vitlab.writers`, whose writers are re-exported here as before they moved).
"""

from vitlab.analysis.analyze import AnalysisResult, analyze_model
from vitlab.analysis.attention_maps import (
    TokenLayout,
    class_token_attention,
    readout_attention,
    readout_label,
    readout_register_attention,
    to_grid,
)
from vitlab.analysis.collapse import (
    CollapseGroup,
    SimilarityMeter,
    adjacent_similarity,
    attention_entropy,
    collapse_groups,
    cross_layer_similarity,
    is_probability_rows,
    similar_blocks,
)
from vitlab.analysis.pos_embed import patch_pos_embed, pos_embed_similarity, similarity_grid
from vitlab.analysis.residuals import BlockRatio, gated_blocks, residual_ratios, stack_ratios, summarize_ratios
from vitlab.analysis.rollout import (
    HEAD_FUSIONS,
    METHODS,
    AttentionGradients,
    Rollout,
    attention_gradients,
    class_attention_rollout,
    discard_lowest,
    explain,
    fuse_heads,
    gradient_rollout,
    model_rollout,
    rollout,
)
from vitlab.writers import Section, atomic_path, read_csv, versions, write_csv, write_json, write_report

__all__ = [
    "HEAD_FUSIONS", "METHODS", "AnalysisResult", "AttentionGradients", "BlockRatio", "CollapseGroup", "Rollout",
    "Section", "SimilarityMeter", "TokenLayout", "adjacent_similarity", "analyze_model", "atomic_path",
    "attention_entropy", "attention_gradients", "class_attention_rollout", "class_token_attention", "collapse_groups",
    "cross_layer_similarity", "discard_lowest", "explain", "fuse_heads", "gated_blocks", "gradient_rollout",
    "is_probability_rows", "model_rollout", "patch_pos_embed", "pos_embed_similarity", "read_csv",
    "readout_attention", "readout_label", "readout_register_attention", "residual_ratios", "rollout",
    "similar_blocks", "similarity_grid",
    "stack_ratios", "summarize_ratios", "to_grid", "versions", "write_csv", "write_json", "write_report",
]
