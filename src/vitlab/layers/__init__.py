"""Building blocks; each arithmetic module has ``flop_count(num_tokens)`` counting multiplies only."""

from vitlab.layers.attention import Attention, AttentionBase, check_heads, record_attention, record_pre_mix
from vitlab.layers.block import Block, ResidualGates, record_residuals
from vitlab.layers.block_variants import BLOCKS, block_layer, init_block_variants
from vitlab.layers.class_attention import ClassAttention, ClassAttentionBlock
from vitlab.layers.depth_scale import DEPTH_GATES, DepthScale, depth_mup_scale
from vitlab.layers.drop_path import DROP_PATH_RULES, DropPath, drop_path_rates
from vitlab.layers.layer_scale import GATES, LayerScale, ScalarGate, cait_init_value, make_gate
from vitlab.layers.mlp import MLPS, Mlp, SwiGLU, mlp_layer
from vitlab.layers.norm import NORMS, LayerNorm, RMSNorm, norm_layer
from vitlab.layers.parallel_block import ParallelBlock
from vitlab.layers.patch_embed import ConvStem, PatchEmbed, check_grid
from vitlab.layers.pos_embed import POS_EMBEDS, build_pos_embed, resample_abs_pos_embed, sincos_1d, sincos_2d
from vitlab.layers.postnorm import DeepNormBlock, PostNormBlock, deepnorm_alpha, deepnorm_beta
from vitlab.layers.reattention import REATTN_NORMS, ReAttention
from vitlab.layers.rope import apply_rope, layout_rope, rope_2d_angles
from vitlab.layers.sigma_reparam import SigmaReparamLinear, apply_sigma_reparam

__all__ = [
    "Attention", "AttentionBase", "BLOCKS", "Block", "ClassAttention", "ClassAttentionBlock", "ConvStem",
    "DEPTH_GATES", "DROP_PATH_RULES", "DeepNormBlock", "DepthScale", "DropPath", "GATES", "LayerNorm", "LayerScale",
    "MLPS", "Mlp", "NORMS", "POS_EMBEDS", "ParallelBlock", "PatchEmbed", "PostNormBlock", "REATTN_NORMS", "RMSNorm",
    "ReAttention", "ResidualGates", "ScalarGate", "SigmaReparamLinear", "SwiGLU", "apply_rope", "apply_sigma_reparam",
    "block_layer", "build_pos_embed", "cait_init_value", "check_grid", "check_heads", "deepnorm_alpha",
    "deepnorm_beta", "depth_mup_scale", "drop_path_rates", "init_block_variants", "layout_rope", "make_gate",
    "mlp_layer", "norm_layer", "record_attention", "record_pre_mix", "record_residuals", "resample_abs_pos_embed",
    "rope_2d_angles", "sincos_1d", "sincos_2d",
]
