"""Studies that turn training runs into CSV files, figures and an offline ``index.html``: hyper-parameter sweeps,
the depth study (LayerScale, ReZero, SkipInit, CaiT, DeepViT against depth), cost against the number of tokens
and the comparison with timm models. Each is a ``vitlab`` sub-command; the functions here do the work.
"""

from vitlab.experiments.common import RunSpec, aggregate, fit_power_law, mean_std, run_all, run_or_load, train_run

__all__ = ["RunSpec", "aggregate", "fit_power_law", "mean_std", "run_all", "run_or_load", "train_run"]
