"""Cost against the number of tokens: measured forward and forward+backward time and
memory at several image sizes, a fitted exponent ``b`` of ``time ~ tokens ** b``, and the analytic MACs split
into the part linear in the tokens and the attention part quadratic in them.

Memory: on CUDA, the peak of ``torch.cuda.max_memory_allocated`` during forward+backward above what was
allocated before. On CPU there is no reliable allocator peak (``tracemalloc`` does not see torch's
allocations and the process RSS only ever grows), so vitlab counts the **activation bytes saved for
backward**: every tensor autograd keeps during the forward pass, through
``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters excluded. This is the memory
training needs beyond the weights; with the fused attention kernel it does not hold the ``T x T`` maps.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitlab.errors import ConfigError
from vitlab.experiments.power_law import fit_power_law

BACKENDS = ("fused", "math")
COLUMNS = ("img_size", "tokens", "batch_size", "forward_s", "forward_backward_s", "memory_bytes", "memory_kind",
           "macs", "linear_macs", "attention_macs", "attention_share")


@dataclass
class SizePoint:
    """The measurements at one image size (times are medians per batch, MACs per image)."""

    img_size: int
    tokens: int
    batch_size: int
    forward_s: float
    forward_backward_s: float
    memory_bytes: int
    memory_kind: str
    macs: int
    linear_macs: int
    attention_macs: int

    def row(self) -> dict[str, Any]:
        return {"img_size": self.img_size, "tokens": self.tokens, "batch_size": self.batch_size,
                "forward_s": self.forward_s, "forward_backward_s": self.forward_backward_s,
                "memory_bytes": self.memory_bytes, "memory_kind": self.memory_kind, "macs": self.macs,
                "linear_macs": self.linear_macs, "attention_macs": self.attention_macs,
                "attention_share": self.attention_macs / self.macs if self.macs else 0.0}


def num_tokens(model: nn.Module) -> int:
    """Tokens the widest stage of ``model`` processes per image (patches plus class / register tokens)."""
    return max(r.num_tokens for r in model.flop_rows())


def split_macs(model: nn.Module) -> tuple[int, int]:
    """``(token-linear MACs, attention T^2 MACs)`` per image; their sum is ``model.flop_count()``.

    Each arithmetic module's count is a polynomial of degree <= 2 in its number of tokens ``t``; the
    quadratic coefficient comes from the second difference ``(f(3) - 2 f(2) + f(1)) / 2`` and is multiplied
    by ``t**2``. Everything else (linear in ``t``, or fixed like the head) is the token-linear part.
    """
    from vitlab.models.base import module_flops

    quadratic = 0
    for r in model.flop_rows():
        f = [module_flops(r.module, t, False, **r.kwargs) for t in (1, 2, 3, 4)]
        c2 = (f[2] - 2 * f[1] + f[0]) // 2
        if f[3] - 3 * f[2] + 3 * f[1] - f[0] != 0:
            raise ConfigError(f"the FLOP count of {r.name} is not quadratic in its tokens; cannot split it")
        quadratic += c2 * r.num_tokens ** 2
    return model.flop_count() - quadratic, quadratic


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Any, repeats: int, device: torch.device) -> float:
    fn()  # warm-up: allocator, kernels, autotuning
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def saved_activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one training forward of ``model(x)``: each
    storage counted once, the model's parameters (saved by reference) left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return sum(seen.values())


def cuda_peak_bytes(step: Any, device: torch.device) -> int:
    """Peak allocated CUDA bytes during ``step()`` above what was allocated before it."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def attention_backend(name: str) -> Any:
    """A context that runs ``scaled_dot_product_attention`` with torch's choice (``fused``) or the ``math``
    kernel, which materialises the ``T x T`` attention maps (and saves them for backward)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return contextlib.nullcontext() if name == "fused" else sdpa_kernel(SDPBackend.MATH)


def measure_size(model: nn.Module, *, batch_size: int, repeats: int, device: torch.device,
                 backend: str = "fused") -> SizePoint:
    """Time forward (eval, no grad) and forward+backward (train) of ``model`` on a random batch, and its memory."""
    with attention_backend(backend):
        return _measure(model, batch_size=batch_size, repeats=repeats, device=device)


def _measure(model: nn.Module, *, batch_size: int, repeats: int, device: torch.device) -> SizePoint:
    cfg = model.cfg
    model = model.to(device)
    x = torch.randn(batch_size, cfg.in_chans, cfg.img_size, cfg.img_size, device=device)

    def forward() -> None:
        with torch.no_grad():
            model(x)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        model(x).float().sum().backward()

    model.eval()
    fwd = _median_time(forward, repeats, device)
    model.train()
    fwd_bwd = _median_time(forward_backward, repeats, device)
    if device.type == "cuda":
        memory, kind = cuda_peak_bytes(forward_backward, device), "cuda_peak_allocated"
    else:
        memory, kind = saved_activation_bytes(model, x), "saved_activations"
    model.zero_grad(set_to_none=True)
    linear, attention = split_macs(model)
    return SizePoint(cfg.img_size, num_tokens(model), batch_size, fwd, fwd_bwd, memory, kind, linear + attention,
                     linear, attention)


@dataclass
class ComplexityResult:
    points: list[SizePoint]
    fits: list[dict[str, Any]]  # quantity, exponent b, intercept a


FITTED = (("forward_s", "forward time"), ("forward_backward_s", "forward+backward time"),
          ("memory_bytes", "memory"), ("macs", "analytic MACs"), ("attention_macs", "attention MACs"),
          ("linear_macs", "token-linear MACs"))


def fit_rows(points: list[SizePoint]) -> list[dict[str, Any]]:
    """One row per measured quantity: the exponent ``b`` of ``quantity ~ tokens ** b`` over all sizes, and over
    the two largest sizes (the local slope, closest to the asymptotic regime)."""
    tokens = [p.tokens for p in points]
    rows = []
    for key, label in FITTED:
        values = [getattr(p, key) for p in points]
        if not all(v > 0 for v in values):
            continue
        a, b = fit_power_law(tokens, values)
        _, b_end = fit_power_law(tokens[-2:], values[-2:])
        rows.append({"quantity": key, "label": label, "exponent": b, "intercept": a, "exponent_last_two": b_end})
    return rows


def measure_complexity(model_name: str, img_sizes: list[int], *, overrides: dict[str, Any] | None = None,
                       batch_size: int = 8, repeats: int = 5, device: str | torch.device = "cpu",
                       backend: str = "fused", log: Any = None) -> ComplexityResult:
    """Measure ``model_name`` (a vitlab preset, with ``overrides``) at each of ``img_sizes`` and fit the exponents."""
    from vitlab.models import create_model

    if len(img_sizes) < 2:
        raise ConfigError("give at least two image sizes to fit an exponent, e.g. --img-sizes 28,56,84,112")
    if batch_size < 1 or repeats < 1:
        raise ConfigError(f"batch size and repeats must be >= 1, got {batch_size} and {repeats}")
    attention_backend(backend)
    device = torch.device(device)
    models = [create_model(model_name, **{**(overrides or {}), "img_size": s}) for s in sorted(img_sizes)]
    points = []
    for i, model in enumerate(models):
        points.append(measure_size(model, batch_size=batch_size, repeats=repeats, device=device, backend=backend))
        p = points[-1]
        if log:
            log(f"[{i + 1}/{len(models)}] img_size {p.img_size}: {p.tokens} tokens, "
                f"forward {1e3 * p.forward_s:.1f} ms, forward+backward {1e3 * p.forward_backward_s:.1f} ms, "
                f"memory {p.memory_bytes / 2**20:.1f} MiB")
        models[i] = None  # free it before the next, larger one
    return ComplexityResult(points, fit_rows(points))


@dataclass
class ComplexityConfig:
    """A whole complexity study: ``model`` measured at every image size."""

    model: str  # a vitlab preset
    img_sizes: list[int]  # image sides in pixels, multiples of the patch size
    output: Path  # the study folder
    overrides: dict[str, Any] = field(default_factory=dict)  # model options at every size (not img_size)
    batch_size: int = 8
    repeats: int = 5  # timed repeats per size, the median is kept
    attention: str = "fused"  # fused | math (BACKENDS)
    device: str = "cpu"
    threads: int | None = None  # torch threads (None: torch's)
    command: str = ""  # the command line the report shows
    force: bool = False  # replace the files of the study's names in an --output folder vitlab did not claim


def run_complexity(config: ComplexityConfig, log: Any = None) -> dict[str, Any]:
    """Measure, fit, and write complexity.csv, fits.csv, complexity.png, summary.json and index.html into
    ``config.output``; returns the result, its fits by quantity, the report's text, the study folder (``out``) and
    the thread count. ``log(line)`` hears one line per size."""
    from vitlab.experiments.runs import check_output
    from vitlab.models import get_config
    from vitlab.plots.study import plot_complexity
    from vitlab.writers import Section, write_csv, write_json, write_report

    sizes, overrides = config.img_sizes, config.overrides
    if "img_size" in overrides:
        raise ConfigError("img_size is what --img-sizes varies; remove --set img_size")
    cfg = get_config(config.model, **overrides)
    bad = [s for s in sizes if s % cfg.patch_size]
    if bad:
        raise ConfigError(f"--img-sizes {','.join(map(str, bad))} are not multiples of the patch size "
                          f"{cfg.patch_size}; use e.g. {','.join(str(cfg.patch_size * k) for k in (4, 8, 12, 16))}")
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {config.device} asks for CUDA but none is available; use --device cpu")
    if config.threads is not None:
        if config.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {config.threads}")
        torch.set_num_threads(config.threads)
    out = check_output(config.output, "complexity", force=config.force)
    result = measure_complexity(config.model, sizes, overrides=overrides, batch_size=config.batch_size,
                                repeats=config.repeats, device=device, backend=config.attention, log=log)
    write_csv(out / "complexity.csv", [p.row() for p in result.points], COLUMNS)
    write_csv(out / "fits.csv", result.fits)
    title = (f"{config.model}: cost against tokens ({device.type}, {config.attention} attention, batch "
             f"{config.batch_size}, {torch.get_num_threads()} threads)")
    plot_complexity(result, out / "complexity.png", title)
    fits = {r["quantity"]: r for r in result.fits}
    write_json(out / "summary.json", {"model": config.model, "overrides": overrides, "device": str(device),
                                      "attention": config.attention,
                                      "threads": torch.get_num_threads(), "points": [p.row() for p in result.points],
                                      "fits": result.fits})
    last = result.points[-1]
    text = (f"Fitted exponents b of quantity ~ tokens^b over {len(sizes)} sizes: forward "
            f"{fits['forward_s']['exponent']:.2f}, forward+backward {fits['forward_backward_s']['exponent']:.2f}, "
            f"analytic MACs {fits['macs']['exponent']:.2f} (attention part {fits['attention_macs']['exponent']:.2f}, "
            f"token-linear part {fits['linear_macs']['exponent']:.2f}). At {last.tokens} tokens the attention "
            f"(T^2) part is {100 * last.attention_macs / last.macs:.1f}% of the MACs, so the measured exponent "
            "moves from about 1 towards 2 as the token count grows.\n\n"
            "Memory on CUDA is the peak allocated during forward+backward above the baseline; on CPU it is the "
            "activation bytes autograd saves for backward (saved_tensors_hooks, each storage once, parameters "
            "left out), because tracemalloc does not see torch's allocator and the RSS only grows. The fused "
            "attention kernel does not save the T x T maps, so this memory grows about linearly; with --attention "
            "math the maps are saved and the quadratic term appears. Times are medians of the repeats on a "
            "machine that may be shared.")
    write_report(out, title, config.command, [
        Section("Cost against tokens", text, ["complexity.png"], ["complexity.csv", "fits.csv"])])
    return {"result": result, "fits": fits, "text": text, "out": out}
