"""What a stand-in trainer of a study test leaves in its run folder: the record a real run leaves (a checkpoint of the
cell's model and a training state, its run config under the manifest's checksum, and ``summary.json``), so that
the study reads the run back as it reads a real one (:func:`vitlab.experiments.record.finished_run` verifies every
one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def finish(cfg: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """Write the record of the run ``cfg`` (its ``output`` the run folder) with ``summary``; returns ``summary``."""
    import vitlab
    from vitlab.checkpoint import save_checkpoint, weights_of

    out = Path(cfg.output)
    model = vitlab.create_model(cfg.model or "vit_mnist", **dict(cfg.model_overrides or {}))
    save_checkpoint(out, model, run_config=cfg.to_dict(), train_state={"model": weights_of(model)})
    (out / "summary.json").write_text(json.dumps(summary))
    return summary
