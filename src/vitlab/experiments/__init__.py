"""Studies that turn training runs into CSV files, figures and an offline ``index.html``: hyper-parameter sweeps,
the depth study (LayerScale, ReZero, SkipInit, CaiT, DeepViT against depth), cost against the number of tokens
and the comparison with timm models. Each is a ``vitlab`` sub-command; the functions here do the work.

Shared by every study: :mod:`~vitlab.experiments.runs` (train or read back each run), :mod:`~vitlab.experiments.table`
(result rows and aggregates over seeds), :mod:`~vitlab.experiments.budget` (epochs per run, the under-trained
check), :mod:`~vitlab.experiments.values` (lists of values as text) and :mod:`~vitlab.experiments.power_law`.
"""

from vitlab.experiments.power_law import fit_power_law
from vitlab.experiments.runs import RunSpec, run_all, run_or_load, train_run
from vitlab.experiments.table import aggregate, mean_std

__all__ = ["RunSpec", "aggregate", "fit_power_law", "mean_std", "run_all", "run_or_load", "train_run"]
