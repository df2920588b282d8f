"""timm interop: ``from_timm`` / ``to_timm`` conversion and ``load_pretrained`` with weight adaptation."""

from vitlab.interop.pretrained import (
    adapt_input_channels,
    adapt_state_dict,
    from_timm,
    load_pretrained,
    read_weights,
    resample_patch_kernel,
    save_weights,
)
from vitlab.interop.timm_convert import (
    config_from_state_dict,
    config_from_timm,
    timm_unsupported,
    to_timm,
)

__all__ = ["adapt_input_channels", "adapt_state_dict", "config_from_state_dict", "config_from_timm", "from_timm",
           "load_pretrained", "read_weights", "resample_patch_kernel", "save_weights", "timm_unsupported", "to_timm"]
