"""The ``vitlab`` command.

Each sub-command lives in its own module under ``vitlab.commands`` and exposes
``register(subparsers)``, which adds an ``argparse`` parser whose ``func(args) -> int`` runs it.
Bad input raised as :class:`~vitlab.errors.VitlabError` (or ``ValueError``) becomes one line on
stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitlab import commands, provenance
from vitlab.errors import VitlabError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention)
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vitlab", description=__doc__.splitlines()[0])
    from vitlab.version import __version__

    parser.add_argument("--version", action="version", version=f"vitlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vitlab.commands.{info.name}")
        if hasattr(module, "register"):  # a helper module (options.py) registers no command
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    provenance.set_command(sys.argv[1:] if argv is None else argv)  # each run's summary.json names it
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    with warnings.catch_warnings():  # vitlab's own warnings are one line too (a checkpoint file that is not checked)
        warnings.showwarning = _one_line_warnings(args.command, warnings.showwarning)
        return _run(args)


def _one_line_warnings(command: str, show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` printing a warning raised in vitlab's code as ``vitlab COMMAND: warning: ...``;
    the others go to ``show``."""
    package = str(Path(__file__).parent)

    def one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
        if str(filename).startswith(package):
            print(f"vitlab {command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return one_line


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except VitlabError as exc:
        print(f"vitlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        print(f"vitlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file system refused a path (a name too long, a full or read-only disk): one line
        text = " ".join(str(exc).split()) or type(exc).__name__
        print(f"vitlab {args.command}: error: {text}; check that path or pick another", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitlab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
