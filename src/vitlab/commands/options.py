"""What the ``vitlab`` sub-commands share on the command line: the options of every study (the training options,
the data set, the depth grid, seeds, ``--set``, the study folder, ``--dry-run``), the run config they make, the end
of every study command (plan or train, report, exit status: :func:`run_study_command`), and the exact command a
report prints.

The values themselves are parsed by one set of rules, :mod:`vitlab.train.config` (``--set``, ``--run-set``);
argparse and the torch-free imports stay here, so that ``vitlab COMMAND --help`` answers without loading torch.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from vitlab.experiments.budget import BUDGETS  # torch-free at import, as everything a parser is built from


def command_line(args: argparse.Namespace, paired: tuple[str, str] | None = None) -> str:
    """The exact command that ran: ``vitlab COMMAND`` and every option with the value used.

    The sub-command registers its parser as ``args._parser`` (``p.set_defaults(_parser=p)``). ``paired``
    names two repeated options written alternately (``--param A --values 1,2 --param B --values 3``).
    """
    parser: argparse.ArgumentParser = args._parser
    words = ["vitlab", args.command]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "_parser", "func"):
            continue
        value = getattr(args, action.dest, None)
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if paired and action.dest in paired:
            if action.dest == paired[0]:
                second = getattr(args, paired[1]) or []
                for a, b in zip(value or [], second):
                    words += [flag, str(a), f"--{paired[1].replace('_', '-')}", str(b)]
            continue
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                words.append(flag)
        elif isinstance(action, argparse._StoreFalseAction):
            if not value:
                words.append(flag)
        elif value is None:
            continue
        elif isinstance(value, list):
            for v in value:
                words += [flag, str(v)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The training options every study shares (anything left out takes the data set's recipe)."""
    p.add_argument("--budget", choices=tuple(BUDGETS), default="default",
                   help="epochs per run relative to the data set's recipe: quick (a fifth: a smoke test, its runs "
                        "end under-trained), default (the recipe's epochs, 50 on mnist-5k: past the early "
                        "plateau), long (twice the recipe's)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per run, exactly (overrides --budget; default: the budget's)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size (default: the recipe's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)")
    p.add_argument("--limit-train", type=int, default=None, metavar="N", help="train on a fixed subset of N images")
    p.add_argument("--limit-test", type=int, default=None, metavar="N", help="test on the first N test images")
    p.add_argument("--val-split", type=float, default=None, metavar="F",
                   help="hold out this fraction of each run's training images as a validation split (as `vitlab "
                        "train --val-split`): the tables gain val_acc and best_val_acc, and what a study chooses "
                        "is chosen on them, never on the test set")
    p.add_argument("--data-dir", default=None, metavar="DIR", help="local data folder (see vitlab.data.load_dataset)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's)")
    p.add_argument("--no-augment", action="store_true",
                   help="switch every augmentation off (as `vitlab train --no-augment`); short studies learn faster")
    p.add_argument("--run-set", action="append", default=None, metavar="KEY=VALUE",
                   help="any other run option of `vitlab train` for every run (repeatable), e.g. warmup_epochs=1")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no per-epoch progress bars (one line per run is still printed)")
    p.add_argument("--logger", default="none", metavar="NAME",
                   help="also track every run and the study's figures in tensorboard | mlflow | wandb (default none)")
    p.add_argument("--finished-only", action="store_true",
                   help="train nothing: read back the runs already finished in --output and write the tables and "
                        "figures from them (a study split over processes or sessions)")
    add_executor_options(p)


def add_dry_run_option(p: argparse.ArgumentParser) -> None:
    """``--dry-run``: print each run's plan and the study's estimated cost, then stop."""
    p.add_argument("--dry-run", action="store_true",
                   help="print each run's plan (model, data, schedule, threads; as `vitlab train --dry-run`) and the "
                        "FLOPs of the runs left to train, then stop: nothing is trained or written")


def add_force_option(p: argparse.ArgumentParser) -> None:
    """``--force``: write into an ``--output`` folder that holds files of the command's names without vitlab's marker
    (:mod:`vitlab.outputs`)."""
    p.add_argument("--force", action="store_true",
                   help="write into an --output folder vitlab did not claim (no .vitlab-output.json) although it "
                        "holds files of the names this command writes, replacing them (a run folder is refused "
                        "all the same)")


STUDY_FOLDER = "study folder (runs, CSV, figures, index.html)"  # what --output holds for most studies


def add_study_data_options(p: argparse.ArgumentParser) -> None:
    """``--dataset``: the data set every run of a study trains on."""
    p.add_argument("--dataset", default="mnist-5k", help="data set (default mnist-5k)")


def add_depth_grid_options(p: argparse.ArgumentParser, *, default_variants: str, variants_help: str,
                           depths_example: str, lrs: bool = False) -> None:
    """The grid of a depth study (:mod:`vitlab.experiments.depth_study`'s variants): ``--base``, ``--depths``, with
    ``lrs`` also ``--lrs`` (the learning-rate study's rates), and ``--variants`` (default ``default_variants``)."""
    p.add_argument("--base", default="vit_mnist", help="preset giving width, heads, image and patch size "
                                                       "(default vit_mnist)")
    p.add_argument("--depths", required=True, metavar="D1,D2,...", help=f"depths to train, e.g. {depths_example}")
    if lrs:
        p.add_argument("--lrs", required=True, metavar="LR1,LR2,...",
                       help="peak learning rates, e.g. 3e-4,7e-4,2e-3,5e-3,1e-2 (33x around the recipe's 2e-3)")
    p.add_argument("--variants", default=default_variants, metavar="V1,V2,...", help=variants_help)


def add_seeds_option(p: argparse.ArgumentParser, per: str, note: str = "") -> None:
    """``--seeds N``: runs per cell of the study's grid (``per`` names the cell), seeds 0..N-1."""
    p.add_argument("--seeds", type=int, default=1, help=f"runs per {per}, seeds 0..N-1 (default 1{note})")


def add_set_option(p: argparse.ArgumentParser, help: str, metavar: str = "KEY=VALUE") -> None:
    """``--set``: a model option for every run (repeatable), read by :func:`vitlab.train.config.parse_set`."""
    p.add_argument("--set", action="append", default=None, metavar=metavar, help=help)


def add_probe_images_option(p: argparse.ArgumentParser, help: str) -> None:
    """``--probe-images N``: the training images each run's per-layer probes are measured on (default 64)."""
    p.add_argument("--probe-images", type=int, default=64, metavar="N", help=help)


def add_study_output_options(p: argparse.ArgumentParser, help: str = STUDY_FOLDER, *, dry_run: bool = True) -> None:
    """``--output`` (required), ``--force`` and, with ``dry_run``, ``--dry-run``: where a study writes."""
    p.add_argument("--output", required=True, metavar="DIR", help=help)
    add_force_option(p)
    if dry_run:
        add_dry_run_option(p)


def add_executor_options(p: argparse.ArgumentParser) -> None:
    """Where a study's runs train (:mod:`vitlab.experiments.executors`)."""
    g = p.add_argument_group("where the runs train (docs/experiments.md, 'Running a study on many workers')")
    g.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine (default); ray: each run a Ray task on the cluster "
                        "of --address (pip install 'vitlab[ray]')")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="--executor local: runs trained at once, each in its own process with cores/N threads "
                        "(1: one after another in this process; default: one per core for small models on the CPU, "
                        "else 1)")
    g.add_argument("--address", default=None, metavar="HOST:PORT",
                   help="--executor ray: the cluster's address (default: RAY_ADDRESS, else a Ray instance started "
                        "on this machine)")
    g.add_argument("--gpus-per-run", type=float, default=None, metavar="F",
                   help="--executor ray: the share of a GPU each run asks for, e.g. 0.25 trains four runs per card "
                        "(default 0)")
    g.add_argument("--retries", type=int, default=1, metavar="N",
                   help="further attempts of a run whose worker died or that raised, before the table reports it "
                        "failed (default 1)")


def executor_config(args: argparse.Namespace) -> Any:
    """The :class:`~vitlab.experiments.executors.ExecutorConfig` of the study options."""
    from vitlab.experiments.executors import ExecutorConfig

    config = ExecutorConfig(args.executor, args.workers, args.address, args.gpus_per_run or 0.0, args.retries)
    config.validate()
    return config


def base_run_config(args: argparse.Namespace, **fields: Any) -> Any:
    """A :class:`~vitlab.train.config.RunConfig` from the shared options plus ``fields``."""
    from vitlab.experiments.budget import budget_epochs
    from vitlab.train.config import NO_AUGMENT, RunConfig, coerce, parse_set

    extra: dict[str, Any] = {}
    for key, value in parse_set(args.run_set, "--run-set").items():
        extra.update(coerce({key: value}, f"--run-set {key}"))
    epochs = args.epochs
    if epochs is None and getattr(args, "budget", "default") != "default":
        epochs = budget_epochs(args.budget, fields.get("dataset", "mnist-5k"), args.limit_train)
    opts = {"epochs": epochs, "batch_size": args.batch_size, "lr": args.lr, "limit_train": args.limit_train,
            "limit_test": args.limit_test, "val_split": args.val_split, "data_dir": args.data_dir,
            "device": args.device, "threads": args.threads, "progress": args.progress,
            "logger": getattr(args, "logger", None)}
    if args.no_augment:
        opts.update(NO_AUGMENT)
    cfg = RunConfig(**{**{k: v for k, v in opts.items() if v is not None}, **extra, **fields})
    cfg.validate()
    return cfg


def study_fields(args: argparse.Namespace, *, paired: tuple[str, str] | None = None,
                 run_field: str = "run") -> dict[str, Any]:
    """The fields every study config takes from the shared options, by name: the run config of every run (under
    ``run_field``, the config's name for it), the study folder, the command line its report shows (``paired``: as
    :func:`command_line`), ``--finished-only``, where the runs train, ``--force``."""
    return {run_field: base_run_config(args, dataset=args.dataset), "output": args.output,
            "command": command_line(args, paired), "finished_only": args.finished_only,
            "executor": executor_config(args), "force": args.force}


def run_study_command(args: argparse.Namespace, config: Any, *, plan: Callable[[Any], list],
                      train: Callable[[Any], dict[str, Any]], report: Callable[[dict[str, Any]], Iterable[str]],
                      title: str) -> int:
    """The end every study command's ``run`` shares, once its ``config`` is made and checked: with ``--dry-run``
    each run of ``plan(config)`` planned (:func:`vitlab.experiments.runs.print_plans`, lines titled ``title``) and
    nothing trained or written; else ``train(config)``, the lines of ``report(result)`` printed, and the exit status
    of its runs (``result["pairs"]``; 0: every run finished, 3: some failed, each named on stderr)."""
    from vitlab.experiments.runs import exit_status, print_plans

    if args.dry_run:
        return print_plans(plan(config), args.output, title)
    result = train(config)
    for line in report(result):
        print(line)
    return exit_status(args.command, result["pairs"])
