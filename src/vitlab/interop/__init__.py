"""timm interop: ``from_timm`` / ``to_timm`` conversion and ``load_pretrained`` with weight adaptation; the ViT-5
authors' checkpoints: ``from_vit5`` / ``to_vit5``.

``read_weights`` and ``save_weights`` (the weight-file reader and writer) live in :mod:`vitlab.checkpoint` and
are re-exported here for the interop API."""

from vitlab.checkpoint import read_weights, save_weights
from vitlab.interop.pretrained import (
    adapt_input_channels,
    adapt_state_dict,
    from_timm,
    load_pretrained,
    resample_patch_kernel,
)
from vitlab.interop.timm_config import config_from_state_dict, config_from_timm
from vitlab.interop.timm_convert import timm_unsupported, to_timm
from vitlab.interop.vit5_convert import from_vit5, to_vit5, vit5_unsupported

__all__ = ["adapt_input_channels", "adapt_state_dict", "config_from_state_dict", "config_from_timm", "from_timm",
           "from_vit5", "load_pretrained", "read_weights", "resample_patch_kernel", "save_weights", "timm_unsupported",
           "to_timm", "to_vit5", "vit5_unsupported"]
