"""Training: the run options, the run plan (every setting decided once, before the first step), the engine (one
process or ``torchrun``), evaluation.

``train(RunConfig(...))`` runs what ``vitlab train`` runs; ``plan_run(RunConfig(...))`` is the plan it would train.
Checkpoints are read and written by :mod:`vitlab.checkpoint` (``save_checkpoint`` / ``load_model`` / ``read_config`` /
``load_train_state``, re-exported here); ``evaluate`` is :func:`vitlab.inference.evaluate.evaluate`.
"""

from vitlab.checkpoint import load_model, load_train_state, read_config, save_checkpoint
from vitlab.inference.evaluate import evaluate
from vitlab.train.config import RunConfig
from vitlab.train.engine import NonFiniteLoss, Trainer, TrainResult, train
from vitlab.train.plan import RunPlan, plan_run

__all__ = ["NonFiniteLoss", "RunConfig", "RunPlan", "TrainResult", "Trainer", "evaluate", "load_model",
           "load_train_state", "plan_run", "read_config", "save_checkpoint", "train"]
