"""Training: the run config, the engine (one process or ``torchrun``), checkpoints, evaluation.

``train(RunConfig(...))`` runs what ``vitlab train`` runs; ``save_checkpoint`` / ``load_model`` /
``read_config`` / ``load_train_state`` are the checkpoint contract other modules build on.
"""

from vitlab.train.checkpoint import load_model, load_train_state, read_config, save_checkpoint
from vitlab.train.config import RunConfig
from vitlab.train.engine import NonFiniteLoss, Trainer, TrainResult, train
from vitlab.train.evaluate import evaluate

__all__ = ["NonFiniteLoss", "RunConfig", "TrainResult", "Trainer", "evaluate", "load_model", "load_train_state",
           "read_config", "save_checkpoint", "train"]
