"""A trained model out of vitlab: the Hub folder timm reads (:func:`save_for_hf`, :mod:`vitlab.interop.hub`), ONNX
(:func:`export_onnx`) and torch.export's ``.pt2`` (:func:`export_pt2`), each checked against PyTorch on the way out.

Both deployment formats take a batch of any size (the batch dimension is dynamic) at the model's own image size and
channel count, normalised images in, logits out, as ``model(images)`` in PyTorch. ONNX is written with
``torch.onnx.export(dynamo=True)`` at opset :data:`ONNX_OPSET` and run in onnxruntime (when installed) on a batch of
another size than the one traced; ``.pt2`` is reloaded with ``torch.export.load`` and run the same way. An export whose
logits differ from PyTorch's by more than :data:`TOLERANCE` is removed and refused in one line. The input size,
normalisation and class names travel with the file: ONNX metadata ``vitlab`` (a JSON object), and ``vitlab.json`` in
the ``.pt2`` archive (``torch.export.load(path, extra_files={"vitlab.json": ""})``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitlab import atomic
from vitlab.checkpoint.files import check_new_file
from vitlab.checkpoint.weights import first_line
from vitlab.errors import ConfigError
from vitlab.interop.hub import load_checkpoint, save_for_hf

__all__ = ["FORMATS", "ONNX_OPSET", "TOLERANCE", "ExportReport", "default_output", "export", "export_onnx",
           "export_pt2", "save_for_hf"]

FORMATS = ("hf", "onnx", "pt2")
ONNX_OPSET = 18  # onnxruntime 1.16+ runs it; RMSNorm and GELU decompose into opset-18 operators
TOLERANCE = 1e-4  # the largest |logit difference| from PyTorch (float32) an export may show
TRACE_BATCH, CHECK_BATCH = 2, 3  # the batch traced and the batch checked: another size, so the batch is dynamic
INSTALL = "pip install 'vitlab[export]'"


@dataclass(frozen=True)
class ExportReport:
    """What :func:`export_onnx` / :func:`export_pt2` wrote and how it was checked: ``max_diff`` is the largest
    |logit difference| from PyTorch on a random batch of ``batch`` images (None when it could not be run), ``checker``
    what ran the file, or why nothing did."""

    path: Path
    format: str
    max_diff: float | None
    checker: str
    batch: int = CHECK_BATCH

    def line(self) -> str:
        """One line for the terminal."""
        what = "ONNX opset " + str(ONNX_OPSET) if self.format == "onnx" else "torch.export program"
        if self.max_diff is None:
            return f"wrote {self.path} ({what}, dynamic batch); not checked: {self.checker}"
        return (f"wrote {self.path} ({what}, dynamic batch); {self.checker} on a batch of {self.batch}: largest "
                f"|logit - PyTorch's| {self.max_diff:.2e} (tolerance {TOLERANCE:g})")


def default_output(source: str | os.PathLike, fmt: str) -> Path:
    """Where ``vitlab export SOURCE --format fmt`` writes without ``--output``: beside the run folder,
    ``RUN-hf/``, ``RUN.onnx`` or ``RUN.pt2``."""
    src = Path(source).resolve()
    return src.with_name(src.name + ("-hf" if fmt == "hf" else f".{fmt}"))


def export(source: str | os.PathLike, fmt: str, output: str | os.PathLike | None = None, *, force: bool = False,
           verify: bool = True, check: bool = True, **hub_options: Any) -> Path | ExportReport:
    """Export the model of a run folder (or of a Hub folder) as ``fmt`` (:data:`FORMATS`) to ``output`` (default
    :func:`default_output`); ``hub_options`` (``license``, ``name``) go to :func:`save_for_hf`."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out = Path(output) if output is not None else default_output(source, fmt)
    if fmt == "hf":
        return save_for_hf(source, out, force=force, verify=verify, **hub_options)
    if hub_options:
        raise ConfigError(f"{', '.join(hub_options)} belong to --format hf (the model card); drop them")
    check_new_file(out, overwrite=force, flag="--force")  # before the model loads
    model, _ = load_checkpoint(source, verify=verify)
    return (export_onnx if fmt == "onnx" else export_pt2)(model, out, check=check, force=force)


def metadata(model: nn.Module) -> dict[str, Any]:
    """What a deployed file needs besides its graph: timm's ``pretrained_cfg`` input keys and the class names."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    keys = ("architecture", "input_size", "mean", "std", "interpolation", "crop_pct", "num_classes", "label_names")
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items() if k in keys and v is not None}
    spec = getattr(model, "vitlab_spec", None)
    if spec is not None:
        out["vitlab_model"] = spec.to_dict()
    out["input"] = "images (batch, channels, height, width), float32, normalised with mean/std"
    out["output"] = "logits (batch, num_classes)"
    return out


def input_shape(model: nn.Module) -> tuple[int, int, int]:
    """(channels, height, width) ``model`` takes, from its ``pretrained_cfg`` (vitlab and timm models carry it)."""
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size")
    if not size or len(size) != 3:
        raise ConfigError(f"{type(model).__name__} does not state its input size (pretrained_cfg['input_size']); "
                          "export a model built by vitlab.create_model or timm.create_model")
    return int(size[0]), int(size[1]), int(size[2])


def _images(model: nn.Module, batch: int, seed: int) -> Tensor:
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *input_shape(model), generator=g).to(device)


@contextlib.contextmanager
def _quiet_eval(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode, the exporters' progress lines and warnings kept off the terminal."""
    was_training = model.training
    model.eval()
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        model.train(was_training)


def _batch_dim() -> dict[int, Any]:
    return {0: torch.export.Dim("batch", min=1)}


def _label(model: nn.Module) -> str:
    spec = getattr(model, "vitlab_spec", None)
    return spec.label if spec is not None else type(model).__name__


def export_pt2(model: nn.Module, path: str | os.PathLike, *, check: bool = True, force: bool = False) -> ExportReport:
    """Write ``model`` as a ``torch.export`` program (``.pt2``, ``torch.export.save``) with a dynamic batch, then
    load it back and compare its logits with ``model``'s (unless ``check`` is False)."""
    out = check_new_file(path, overwrite=force, flag="--force")
    with _quiet_eval(model):
        try:
            program = torch.export.export(model, (_images(model, TRACE_BATCH, 0),), dynamic_shapes=(_batch_dim(),))
        except Exception as exc:  # noqa: BLE001 - any tracing failure: the model cannot be exported
            raise ConfigError(f"the {_label(model)} model cannot be exported with torch.export "
                              f"({first_line(exc)})") from None
        buf = io.BytesIO()  # torch.export.save wants a name ending in .pt2, or a buffer: the temporary name is neither
        torch.export.save(program, buf, extra_files={"vitlab.json": json.dumps(metadata(model))})
        atomic.atomic_write_bytes(out, buf.getvalue())
        if not check:
            return ExportReport(out, "pt2", None, "--no-check")
        loaded = torch.export.load(out).module()
        return _checked(model, out, "pt2", "torch.export.load", lambda x: loaded(x))


def export_onnx(model: nn.Module, path: str | os.PathLike, *, opset: int = ONNX_OPSET, check: bool = True,
                force: bool = False) -> ExportReport:
    """Write ``model`` as ONNX (``torch.onnx.export(dynamo=True)``, opset ``opset``, input ``images`` with a dynamic
    ``batch`` dimension, output ``logits``), then run it in onnxruntime and compare its logits with ``model``'s
    (unless ``check`` is False or onnxruntime is not installed)."""
    out = check_new_file(path, overwrite=force, flag="--force")
    try:
        import onnx  # noqa: F401 - torch.onnx's dynamo exporter needs onnx and onnxscript
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"ONNX export needs the onnx and onnxscript packages ({exc.name} is missing): "
                          f"{INSTALL}") from None
    with _quiet_eval(model):
        try:
            program = torch.onnx.export(model, (_images(model, TRACE_BATCH, 0),), None, dynamo=True,
                                        opset_version=opset, input_names=["images"], output_names=["logits"],
                                        dynamic_shapes=(_batch_dim(),), optimize=True)
        except Exception as exc:  # noqa: BLE001 - any tracing or translation failure
            raise ConfigError(f"the {_label(model)} model cannot be exported to ONNX opset {opset} "
                              f"({first_line(exc)})") from None
        program.model.metadata_props["vitlab"] = json.dumps(metadata(model))
        try:
            atomic.atomic_write(out, lambda tmp: program.save(tmp, external_data=False))
        except ValueError as exc:  # the protobuf limit
            raise ConfigError(f"the {_label(model)} model does not fit one ONNX file ({first_line(exc)}); call "
                              "torch.onnx.export(..., external_data=True) yourself") from None
        if not check:
            return ExportReport(out, "onnx", None, "--no-check")
        try:
            import onnxruntime as ort
        except ImportError:
            return ExportReport(out, "onnx", None, f"onnxruntime is not installed ({INSTALL})")
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])

        def run(x: Tensor) -> Tensor:
            return torch.from_numpy(session.run(None, {"images": x.detach().cpu().numpy()})[0])

        return _checked(model, out, "onnx", f"onnxruntime {ort.__version__}", run)


def _checked(model: nn.Module, out: Path, fmt: str, checker: str, run: Any) -> ExportReport:
    """Compare ``run(x)`` with ``model(x)`` on a batch of :data:`CHECK_BATCH`; beyond :data:`TOLERANCE` the file is
    removed and the export refused."""
    x = _images(model, CHECK_BATCH, 1)
    with torch.no_grad():
        want = model(x).float().cpu()
        got = run(x).float().cpu()
    if got.shape != want.shape:
        out.unlink(missing_ok=True)
        raise ConfigError(f"the {fmt} export of the {_label(model)} model gives logits of shape {tuple(got.shape)}, "
                          f"PyTorch {tuple(want.shape)}; nothing was kept (report this as a vitlab bug)")
    diff = float((got - want).abs().max())
    if not diff <= TOLERANCE:
        out.unlink(missing_ok=True)
        raise ConfigError(f"the {fmt} export of the {_label(model)} model differs from PyTorch by up to {diff:.2e} "
                          f"in the logits ({checker}; tolerance {TOLERANCE:g}); nothing was kept (report this as a "
                          "vitlab bug)")
    return ExportReport(out, fmt, diff, checker)
