"""The checkpoint format, in one place: the model spec a checkpoint stores (built by ``vitlab.create_model``),
weight files, the checkpoint directory (weights + ``config.json`` + training state + ``manifest.json``, their
checksums). ``train``, ``interop``, the commands and the studies read and write checkpoints only through this
package; every write goes through :mod:`vitlab.atomic`.
"""

from vitlab.checkpoint.files import (
    CONFIG,
    FORMAT,
    STATE,
    WEIGHTS,
    load_model,
    load_train_state,
    read_config,
    read_spec,
    read_weights,
    save_checkpoint,
    state_mismatch,
    weights_of,
)
from vitlab.checkpoint.manifest import MANIFEST
from vitlab.checkpoint.spec import TIMM_PREFIX, ModelSpec, is_timm, spec_of, unwrap
from vitlab.checkpoint.weights import check_output_path, save_weights

__all__ = ["CONFIG", "FORMAT", "MANIFEST", "STATE", "TIMM_PREFIX", "WEIGHTS", "ModelSpec", "check_output_path",
           "is_timm", "load_model", "load_train_state", "read_config", "read_spec", "read_weights", "save_checkpoint",
           "save_weights", "spec_of", "state_mismatch", "unwrap", "weights_of"]
