"""``analyze_model``: every analysis of one model on one batch of images, written as PNG + CSV + JSON and an
offline ``index.html``.

Files (all in ``out_dir``): ``collapse_similarity.{png,csv}``, ``collapse_layers.csv``,
``collapse_similar_blocks.png``, ``residual_ratios.{png,csv}``, ``attention_heads.png``,
``attention_rollout.png``, ``attention_maps.csv``, ``pos_embed_similarity.{png,csv}`` (models with an
absolute position embedding), ``probes_layers.csv``, ``probes_heads.csv``, ``probes.png`` and
``artifact_tokens.png`` (the per-layer probes of :mod:`vitlab.analysis.probes`), ``summary.json`` and
``index.html``; with ``show_registers`` and a model with register tokens also ``attention_registers.{png,csv}``.
They are written into a hidden staging folder and moved into place at the end, so a failed run leaves nothing
behind; the folder is claimed with the marker of :mod:`vitlab.outputs` (``.vitlab-output.json``), and a folder
of a user's files of these names refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from vitlab import outputs
from vitlab.analysis.attention_maps import TokenLayout, readout_attention, readout_label, readout_register_attention
from vitlab.analysis.collapse import CollapseGroup, SimilarityMeter, adjacent_similarity
from vitlab.analysis.pos_embed import patch_pos_embed, pos_embed_similarity, similarity_grid
from vitlab.analysis.probes import MIN_ARTIFACT_TOKENS, Probes, probe_model
from vitlab.analysis.residuals import BlockRatio, stack_ratios, summarize_ratios
from vitlab.analysis.rollout import attention_gradients, check_options, model_rollout
from vitlab.errors import ConfigError, DataError
from vitlab.layers.attention import AttentionBase, record_attention
from vitlab.layers.block import record_residuals
from vitlab.models.eval_mode import analysis_mode
from vitlab.plots import analysis as plots
from vitlab.writers import Section, versions, write_csv, write_json, write_report

OUTPUTS = ("collapse_similarity.png", "collapse_similarity.csv", "collapse_layers.csv", "collapse_similar_blocks.png",
           "residual_ratios.png", "residual_ratios.csv", "attention_heads.png", "attention_rollout.png",
           "attention_maps.csv", "pos_embed_similarity.png", "pos_embed_similarity.csv", "probes_layers.csv",
           "probes_heads.csv", "probes.png", "artifact_tokens.png", "attention_registers.png",
           "attention_registers.csv", "summary.json", "index.html")
NO_REGISTERS = "the model has no register tokens (reg_tokens=0): nothing extra drawn"


@dataclass
class AnalysisResult:
    """What :func:`analyze_model` computed, and the files it wrote (names relative to ``out_dir``)."""

    out_dir: Path
    groups: list[CollapseGroup]
    ratios: list[BlockRatio]
    cls_attention: Tensor  # (S, H, g, g) for the S shown images, read as the head reads the model
    rollout: Tensor  # (S, g, g)
    target: Tensor | None  # (S,) target classes of gradient rollout, else None
    pos_similarity: Tensor | None  # (N, N)
    summary: dict
    files: list[str] = field(default_factory=list)
    probes: Probes | None = None
    register_attention: dict | None = None  # with show_registers and registers: summary.json's "register_attention"


def attention_layer_names(model: nn.Module, count: int) -> list[str]:
    names = [n for n, m in model.named_modules() if isinstance(m, AttentionBase)]
    return names if len(names) == count else [f"layer {i}" for i in range(count)]


def model_inputs(model: nn.Module, images: Tensor, mean: tuple[float, ...] | None,
                 std: tuple[float, ...] | None) -> Tensor:
    """Check ``images`` against the model and return float inputs: uint8 is scaled to [0, 1] and, given
    ``mean``/``std``, standardised; float images are used as they are."""
    cfg = model.cfg
    want = (cfg.in_chans, cfg.img_size, cfg.img_size)
    if images.dim() != 4 or len(images) == 0:
        raise DataError(f"images must be a non-empty (B, C, H, W) batch, got shape {tuple(images.shape)}")
    if tuple(images.shape[1:]) != want:
        raise DataError(f"images are {tuple(images.shape[1:])} (C, H, W) but the model expects {want}; load the "
                        f"data with img_size={cfg.img_size}, in_chans={cfg.in_chans}")
    if images.dtype != torch.uint8:
        return images.float()
    if mean is None or std is None:
        return images.float() / 255.0
    from vitlab.data import normalize

    return normalize(images, mean, std)


def _collapse_rows(groups: list[CollapseGroup], names: list[str]) -> tuple[list[dict], list[dict]]:
    pairs, layers = [], []
    for g in groups:
        prev = adjacent_similarity(g.similarity)
        n = len(g.layers)
        for i, p in enumerate(g.layers):
            others = (g.similarity[i].sum() - g.similarity[i, i]) / (n - 1) if n > 1 else float("nan")
            layers.append({"group": g.name, "layer": p, "name": names[p], "similar_blocks": int(g.similar[i]),
                           "similarity_prev": float(prev[i]), "mean_similarity_others": float(others)})
            for j, q in enumerate(g.layers):
                pairs.append({"group": g.name, "layer_p": p, "layer_q": q, "similarity": float(g.similarity[i, j])})
    return pairs, layers


def _attention_rows(cls_attn: Tensor, roll: Tensor, row_names: list[str]) -> list[dict]:
    rows = []
    S, H, g, _ = cls_attn.shape
    maps = [(f"head{h}", cls_attn[:, h]) for h in range(H)] + [("mean", cls_attn.mean(dim=1)), ("rollout", roll)]
    for s in range(S):
        for name, m in maps:
            for r in range(g):
                for c in range(g):
                    rows.append({"image": row_names[s], "map": name, "row": r, "col": c, "value": float(m[s, r, c])})
    return rows


@torch.no_grad()
def analyze_model(model: nn.Module, images: Tensor, out_dir: str | Path, *, labels: Tensor | None = None,
                  classes: list[str] | None = None, mean: tuple[float, ...] | None = None,
                  std: tuple[float, ...] | None = None, threshold: float = 0.9, num_show: int = 6,
                  layer: int | None = None, batch_size: int = 32, command: str | list[str] | None = None,
                  title: str | None = None, method: str = "attention", head_fusion: str = "mean",
                  discard_ratio: float = 0.0, target_class: int | None = None, show_registers: bool = False,
                  force: bool = False) -> AnalysisResult:
    """Run attention collapse, residual ratios, attention maps / rollout and the position-embedding figure.

    ``images``: ``(B, C, H, W)`` uint8 (standardised with ``mean``/``std`` when given) or float model
    inputs. Collapse and residual ratios average over all ``B`` images; the maps show the first
    ``num_show``. Maps and rollout are read as the head reads the model (class token, or the mean of the
    patch tokens when it average-pools). ``layer`` picks the attention map drawn per head (default: the
    last map the head depends on; CaiT: the last class-attention layer, or with average pooling the last
    self-attention layer). ``method``, ``head_fusion``, ``discard_ratio`` and ``target_class`` choose the
    rollout (see :mod:`vitlab.analysis.rollout`). ``show_registers`` draws the register tokens' share of the
    row the maps read (hidden by default) and reports it per layer (``attention_registers.csv``, the
    ``"register_attention"`` key of ``summary.json``); a model without registers gets the key's one-line note
    and no figure. The model runs in eval mode
    (:func:`~vitlab.models.eval_mode.analysis_mode`) on its own device and is put back as it was.
    ``out_dir`` is taken by the rule of :mod:`vitlab.outputs`: new, empty, the marker of an earlier analysis, or
    holding none of :data:`OUTPUTS`; a folder holding any of them without the marker is refused unless ``force``
    (replace them), a run folder always.
    """
    check_options(head_fusion, discard_ratio, method)
    if target_class is not None and method != "gradient":
        raise ConfigError("a target class applies to gradient rollout only; add --rollout gradient")
    if not -1.0 <= threshold <= 1.0:
        raise ConfigError(f"threshold {threshold} is not a cosine similarity; pass a value in [-1, 1], e.g. 0.9")
    if num_show < 1 or batch_size < 1:
        raise ConfigError(f"num_show and batch_size must be >= 1, got {num_show} and {batch_size}")
    x = model_inputs(model, images, mean, std)
    out_dir = Path(out_dir).expanduser()
    outputs.check(out_dir, "analyze", OUTPUTS, force=force)  # a run folder, or a user's files of these names: refused
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.staging-"))
    try:
        with analysis_mode(model):
            result = _run(model, x, images, stage, device=device, labels=labels, classes=classes,
                          threshold=threshold, num_show=min(num_show, len(x)), layer=layer, batch_size=batch_size,
                          command=command, title=title, method=method, head_fusion=head_fusion,
                          discard_ratio=discard_ratio, target_class=target_class, show_registers=show_registers)
        outputs.claim(out_dir, "analyze", OUTPUTS, force=force)
        for name in OUTPUTS:  # outputs of an earlier run this one did not produce would be stale
            if name not in result.files:
                with contextlib.suppress(FileNotFoundError):
                    (out_dir / name).unlink()
        for name in result.files:  # index.html is last: it appears once everything it shows is there
            os.replace(stage / name, out_dir / name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(stage)
    result.out_dir = out_dir
    return result


def default_layer(maps: list[Tensor], layout: TokenLayout) -> int:
    """The last map the head depends on: the last one, or with average pooling the last self-attention map
    (CaiT's class-attention stage does not reach pooled patches)."""
    if layout.reads_class_token:
        return len(maps) - 1
    return max(i for i, m in enumerate(maps) if m.shape[-2] == m.shape[-1])


def rollout_label(method: str, head_fusion: str, discard_ratio: float, target_class: int | None) -> str:
    """How the rollout was made, for titles and the report."""
    parts = [f"heads {head_fusion}"] + ([f"lowest {discard_ratio:g} discarded"] if discard_ratio else [])
    if method == "gradient":
        target = "predicted class" if target_class is None else f"class {target_class}"
        return f"gradient-weighted rollout for the {target} ({', '.join(parts)})"
    return f"attention rollout ({', '.join(parts)})"


def _run(model: nn.Module, x: Tensor, images: Tensor, stage: Path, *, device: torch.device,
         labels: Tensor | None, classes: list[str] | None, threshold: float, num_show: int, layer: int | None,
         batch_size: int, command: str | list[str] | None, title: str | None, method: str, head_fusion: str,
         discard_ratio: float, target_class: int | None, show_registers: bool = False) -> AnalysisResult:
    cfg = model.cfg
    layout = TokenLayout.of(model)
    meter = SimilarityMeter(threshold)
    cls_attn, roll, mass, targets, reg_shown = [], [], [], [], []
    reg_sums: list[Tensor] = []  # per attention layer: (H, R) register attention summed over the images
    draw_registers = show_registers and bool(layout.registers)
    names: list[str] = []
    ratio_parts = []
    label = ""
    for start in range(0, len(x), batch_size):
        chunk = x[start:start + batch_size].to(device)
        grads = None
        with record_residuals(model.modules()) as res:  # one pass records maps and residual ratios
            if method == "gradient":
                ag = attention_gradients(model, chunk, target_class)
                maps, grads = ag.maps, ag.grads
                targets.append(ag.target.cpu())
            else:
                with record_attention(model.modules()) as maps:
                    model(chunk)
        ratio_parts.append(stack_ratios(res))
        if not maps:
            raise ConfigError(f"model {cfg.name or cfg.arch!r} recorded no attention maps; analyse a vitlab model")
        if not names:
            names = attention_layer_names(model, len(maps))
            if layer is None:
                layer = default_layer(maps, layout)
            if not -len(maps) <= layer < len(maps):
                raise ConfigError(f"layer {layer} does not exist: the model has {len(maps)} attention layers "
                                  f"(0..{len(maps) - 1}, or -1 for the last)")
            label = readout_label(maps[layer], layout)
        meter.update(maps)
        r = model_rollout(maps, layout, grads=grads, head_fusion=head_fusion, discard_ratio=discard_ratio)
        mass.append(r.patch_mass.cpu())
        if draw_registers:
            regs = [readout_register_attention(m, layout).sum(dim=0).cpu() for m in maps]
            reg_sums = regs if not reg_sums else [a + b for a, b in zip(reg_sums, regs, strict=True)]
        if start < num_show:
            keep = num_show - start
            cls_attn.append(readout_attention(maps[layer][:keep], layout).cpu())
            if draw_registers:
                reg_shown.append(readout_register_attention(maps[layer][:keep], layout).cpu())
            roll.append(r.relevance[:keep].cpu())
    groups = meter.compute()
    cls_attention, relevance, patch_mass = torch.cat(cls_attn), torch.cat(roll), torch.cat(mass)
    target = torch.cat(targets) if targets else None
    roll_label = rollout_label(method, head_fusion, discard_ratio, target_class)
    ratios = summarize_ratios(model, ratio_parts)

    files: list[str] = []

    def add(name: str) -> str:
        files.append(name)
        return name

    def name_of(y: int) -> str:
        return classes[y] if classes and 0 <= y < len(classes) else str(y)

    def label_of(i: int) -> str:
        text = f"#{i}" if labels is None else f"#{i} ({name_of(int(labels[i]))})"
        return text if target is None else f"{text} -> {name_of(int(target[i]))}"

    # attention collapse
    pairs, layer_rows = _collapse_rows(groups, names)
    write_csv(stage / add("collapse_similarity.csv"), pairs)
    write_csv(stage / add("collapse_layers.csv"), layer_rows)
    pretty = {"self_attention": "self-attention", "class_attention": "class-attention"}
    plots.similarity_heatmaps([(f"{pretty.get(g.name, g.name)} ({g.along}s)", g.similarity, g.layers)
                               for g in groups], stage / add("collapse_similarity.png"))
    plots.similar_blocks_plot([(pretty.get(g.name, g.name), g.layers, g.similar, adjacent_similarity(g.similarity),
                                threshold) for g in groups], stage / add("collapse_similar_blocks.png"))

    # residual ratios
    write_csv(stage / add("residual_ratios.csv"), [r.row() for r in ratios])
    ca = [r.index for r in ratios if r.kind == "class_attention"]
    plots.residual_plot([r.index for r in ratios], [r.attn_mean for r in ratios], [r.mlp_mean for r in ratios],
                        stage / add("residual_ratios.png"), attn_std=[r.attn_std for r in ratios],
                        mlp_std=[r.mlp_std for r in ratios], boundary=ca[0] if ca else None,
                        title=f"residual ratio per block, mean over {len(x)} images")

    # attention maps and rollout
    shown = [label_of(i) for i in range(num_show)]
    display = plots.display_images(images[:num_show])
    H = cls_attention.shape[1]
    layer_index = layer % len(names)
    heads = torch.cat([cls_attention, cls_attention.mean(dim=1, keepdim=True)], dim=1)  # (S, H + 1, g, g)
    plots.overlay_grid(display, heads, [f"head {h}" for h in range(H)] + ["mean"], stage / add("attention_heads.png"),
                       row_titles=shown, title=f"{names[layer_index]}: {label}")
    both = torch.stack([cls_attention.mean(dim=1), relevance], dim=1)  # (S, 2, g, g)
    plots.overlay_grid(display, both, ["mean of heads", "rollout"], stage / add("attention_rollout.png"),
                       row_titles=shown, title=f"{names[layer_index]}: {label}\nand {roll_label}")
    write_csv(stage / add("attention_maps.csv"), _attention_rows(cls_attention, relevance, shown))

    # per-layer probes: over-smoothing, rank collapse, artifact tokens, entropy and logits
    probe = probe_model(model, x, batch_size=batch_size)
    write_csv(stage / add("probes_layers.csv"), probe.rows())
    write_csv(stage / add("probes_heads.csv"), probe.head_rows())
    from vitlab.plots.probes import artifact_figure, probes_figure

    probes_figure(probe, stage / add("probes.png"), title=f"probes per block, mean over {len(x)} images")
    artifact_figure(display, probe, stage / add("artifact_tokens.png"), layout.grid_size, row_titles=shown)

    # register tokens' share of the row the maps read (hidden unless asked for)
    reg_info: dict | None = None
    if draw_registers:
        positions = layout.registers
        reg_names = [f"register {j} (token {p})" for j, p in enumerate(positions)]
        per_layer = [(s / len(x)) for s in reg_sums]  # (H, R) mean over the images
        reg_info = {"tokens": positions, "row": label,
                    "layers": [{"layer": i, "name": names[i], "share": float(m.sum(dim=1).mean()),
                                "per_register": m.mean(dim=0).tolist(), "per_head": m.sum(dim=1).tolist()}
                               for i, m in enumerate(per_layer)]}
        write_csv(stage / add("attention_registers.csv"),
                  [{"layer": d["layer"], "name": d["name"], "register_share": d["share"],
                    **{f"register{j}": v for j, v in enumerate(d["per_register"])}} for d in reg_info["layers"]])
        shown_regs = torch.cat(reg_shown).mean(dim=1)  # (S, R), mean over heads
        plots.register_figure(display, cls_attention.mean(dim=1), cls_attention.sum(dim=(-2, -1)).mean(dim=1),
                              shown_regs, reg_names, [d["share"] for d in reg_info["layers"]], names,
                              stage / add("attention_registers.png"), row_titles=shown,
                              title=f"{names[layer_index]}: {label}; the share on the patches and on each register")

    # position embedding
    pos_sim, pos_note = None, ""
    try:
        table = patch_pos_embed(model)
    except ConfigError as exc:
        pos_note = str(exc)
    else:
        pos_sim = pos_embed_similarity(table)
        g = layout.grid_size
        write_csv(stage / add("pos_embed_similarity.csv"),
                  [{"patch_i": i, "patch_j": j, "row_i": i // g, "col_i": i % g, "row_j": j // g, "col_j": j % g,
                    "similarity": float(pos_sim[i, j])} for i in range(g * g) for j in range(g * g)])
        plots.pos_embed_figure(similarity_grid(pos_sim, g), stage / add("pos_embed_similarity.png"),
                               title=f"position embedding similarity ({cfg.pos_embed})")

    summary = {
        "model": cfg.to_dict(),
        "num_images": len(x),
        "threshold": threshold,
        "attention_layers": names,
        "collapse": [{"group": g.name, "along": g.along, "layers": g.layers,
                      "mean_similarity": g.mean_off_diagonal(), "similar_blocks": g.similar.tolist(),
                      "similarity": g.similarity.tolist()} for g in groups],
        "residual_ratios": [r.row() for r in ratios],
        "attention_layer": names[layer_index],
        "attention_readout": label,
        "head_reads": "class token" if layout.reads_class_token else "mean of patch tokens",
        "rollout": {"method": method, "head_fusion": head_fusion, "discard_ratio": discard_ratio,
                    "target_class": target_class, "label": roll_label,
                    "targets": None if target is None else target.tolist()},
        "rollout_patch_mass": float(patch_mass.mean()),
        "probes": {"artifact_k": probe.k, "artifact_ratio": probe.ratio, "layers": probe.rows()},
        "pos_embed": "drawn" if pos_sim is not None else pos_note,
        **({"register_attention": reg_info if reg_info is not None else NO_REGISTERS} if show_registers else {}),
        "versions": versions(),
    }
    write_json(stage / add("summary.json"), summary)
    cmd = command if command is not None else f"vitlab.analysis.analyze_model({cfg.name or cfg.arch}, {len(x)} images)"
    write_report(stage, title or f"Analysis of {cfg.name or cfg.arch}", cmd,
                 _sections(groups, ratios, pos_sim is not None, pos_note, len(x), threshold, names[layer_index],
                           float(patch_mass.mean()), label, roll_label, probe, reg_info))
    files.append("index.html")
    return AnalysisResult(stage, groups, ratios, cls_attention, relevance, target, pos_sim, summary, files, probe,
                          reg_info)


def _sections(groups: list[CollapseGroup], ratios: list[BlockRatio], has_pos: bool, pos_note: str, n: int,
              threshold: float, layer_name: str, patch_mass: float, label: str, roll_label: str,
              probe: Probes, reg_info: dict | None = None) -> list[Section]:
    collapse = ", ".join(f"{g.name}: mean similarity {g.mean_off_diagonal():.3f}, "
                         f"{int((g.similar > 0).sum())} of {len(g.layers)} layers with a similar block"
                         for g in groups)
    secs = [
        Section("Attention collapse",
                "Cosine similarity of the same head's attention column for the same token between layers p and "
                f"q, averaged over heads, tokens and {n} images (DeepViT). Class-attention layers (one query) "
                f"compare their single query row instead, among themselves. A block is similar to another when "
                f"their similarity exceeds {threshold:g}.\n\n{collapse}.",
                ["collapse_similarity.png", "collapse_similar_blocks.png"], ["collapse_layers.csv"]),
        Section("Residual ratios",
                "||g(x)||_2 / ||x||_2 of the attention and MLP branch of each block (after its gate), per image, "
                f"mean and standard deviation over {n} images (CaiT). Flat curves mean every block contributes "
                "in proportion; LayerScale makes them flatter, zero gates make them 0.",
                ["residual_ratios.png"], ["residual_ratios.csv"]),
        Section("Attention maps",
                f"{layer_name}: {label[0].upper() + label[1:]}. Per head and averaged over heads, then the "
                f"{roll_label}, read the same way. Each overlay is min-max scaled on its own; attention_maps.csv "
                "holds the raw values. Share of the rollout's relevance on the patches (the rest lies on the "
                f"class token and registers): {patch_mass:.3f}.",
                ["attention_heads.png", "attention_rollout.png"], []),
    ]
    last = probe.rows()[-1]
    secs.append(Section(
        "Probes per block",
        "Per self-attention block, over the patch tokens only (class and register tokens left out), mean over "
        f"{n} images: token similarity (mean pairwise cosine; 1 = over-smoothed), effective rank (Roy & Vetterli "
        "2007) of the token matrix (uncentred: 1 = rank collapse, Dong et al. 2021) and of its spread around the "
        "mean token (centred), the residual to rank one ||X - 1x^T||_F / ||X||_F (0 = rank collapse), high-norm "
        f"artifact tokens (norm > {probe.ratio:g} x the 90th percentile and > {probe.k:g} robust standard "
        "deviations of the log norms, pooled over the images; Darcet et al. 2024; NaN below "
        f"{MIN_ARTIFACT_TOKENS} patch tokens) and the attention mass they and the register tokens receive, "
        "attention entropy per head (nats; log T when uniform) and the max pre-softmax logit (Dehghani et al. "
        "2023). docs/analysis.md defines each. "
        f"Last block: similarity {last['token_similarity']:.3f}, effective rank "
        f"{last['effective_rank_uncentred']:.2f} uncentred, {last['effective_rank_centred']:.2f} centred, "
        f"{last['artifact_count']:.2f} artifact tokens per image, max logit {last['max_logit']:.3g}.",
        ["probes.png", "artifact_tokens.png"], ["probes_layers.csv"]))
    if reg_info is not None:
        shares = ", ".join(f"{d['share']:.3f}" for d in reg_info["layers"])
        secs.append(Section(
            "Register tokens",
            f"The share of the row the maps read ({reg_info['row']}) that lies on the register tokens (tokens "
            f"{reg_info['tokens']}), hidden in the maps above: per drawn image beside its mean-of-heads map, and "
            f"per attention layer, mean over heads and {n} images: {shares}.",
            ["attention_registers.png"], ["attention_registers.csv"]))
    if has_pos:
        secs.append(Section("Position embedding",
                            "Cosine similarity of each patch's position embedding with every other patch's: tile "
                            "(r, c) shows patch (r, c) against the whole grid.", ["pos_embed_similarity.png"], []))
    else:
        secs.append(Section("Position embedding", f"Not drawn: {pos_note}"))
    return secs
