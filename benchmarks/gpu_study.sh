#!/usr/bin/env bash
# On a machine with a CUDA GPU: check the CUDA paths of train / eval / analyze (fused attention, bf16 autocast,
# torch.compile), then run the depth study of docs/findings.md with many runs per GPU, into runs/findings/depth
# (where `python benchmarks/findings_tables.py --from-runs` reads it for docs/findings.md).
#
#   benchmarks/gpu_study.sh                 # on the GPU: checks, then the whole study (hours)
#   benchmarks/gpu_study.sh --smoke         # anywhere, on the CPU, in seconds: every step end to end, tiny
#
# Settings (environment): OUT (study folder; default runs/findings/depth, smoke: a temporary folder),
# SEEDS (default 5), WORKERS (runs per GPU with local workers, default 4), EXECUTOR (local | ray; ray runs each
# run with --gpus-per-run 1/WORKERS on the cluster of RAY_ADDRESS or a local one), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
VITLAB=("$PY" -m vitlab)
SEEDS=${SEEDS:-5}
WORKERS=${WORKERS:-4}
EXECUTOR=${EXECUTOR:-local}

if [ "$SMOKE" = 1 ]; then
    DEVICE=cpu
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    OUT=${OUT:-$WORK/depth}
    TINY=(--limit-train 64 --limit-test 32 --batch-size 16 --epochs 1 --threads 1 --no-progress)
    DEPTHS=1,2; VARIANTS=vit,layerscale; SEEDS=1; WORKERS=1
    STUDY_SET=(--set embed_dim=16 --set num_heads=2)
else
    DEVICE=cuda
    WORK=runs/gpu_check
    OUT=${OUT:-runs/findings/depth}
    TINY=(--epochs 1 --no-progress)
    DEPTHS=6,12,24,36; VARIANTS=vit,layerscale,rezero,skipinit,fixup,tfixup,cait,deepvit
    STUDY_SET=()
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU here; run with --smoke')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
mkdir -p "$WORK"
echo "== 1. the CUDA paths ($DEVICE): fused attention, bf16 autocast, torch.compile"
"$PY" - "$DEVICE" "$SMOKE" <<'PYEOF'
import sys, time
import torch
from vitlab import create_model
from vitlab.layers.attention import Attention

device, smoke = torch.device(sys.argv[1]), sys.argv[2] == "1"
model = create_model("vit_mnist", depth=2, embed_dim=16 if smoke else 64, num_heads=2 if smoke else 8).to(device)
x = torch.randn(8, 1, 28, 28, device=device)
attn = [m for m in model.modules() if isinstance(m, Attention)]
with torch.no_grad():
    for m in attn:
        m.fused = True
    fused = model(x)
    for m in attn:
        m.fused = False
    explicit = model(x)
err = (fused - explicit).abs().max().item()
print(f"fused attention (SDPA) against the explicit maps: max |diff| {err:.2e}")
assert err < 1e-3, err
for m in attn:
    m.fused = None
kind = "cuda" if device.type == "cuda" else "cpu"
with torch.autocast(kind, dtype=torch.bfloat16):
    loss = model(x).float().logsumexp(-1).mean()
loss.backward()
assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
print(f"bf16 autocast forward and backward: finite (loss {loss.item():.4f})")
if not smoke:
    def step(m):
        m.zero_grad(set_to_none=True)
        m(x).logsumexp(-1).mean().backward()
    for name, m in (("eager", model), ("torch.compile", torch.compile(model))):
        for _ in range(3):
            step(m)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            step(m)
        torch.cuda.synchronize()
        print(f"{name}: {1000 * (time.perf_counter() - t) / 20:.2f} ms per step of 8 images")
PYEOF
echo "== 2. train, eval and analyze one run on $DEVICE"
"${VITLAB[@]}" train --model vit_mnist --dataset mnist-5k --device "$DEVICE" "${TINY[@]}" \
    $([ "$SMOKE" = 1 ] && echo "--set embed_dim=16 --set num_heads=2") --output "$WORK/train"
"${VITLAB[@]}" eval --checkpoint "$WORK/train" --device "$DEVICE" $([ "$SMOKE" = 1 ] && echo "--limit-test 32")
"${VITLAB[@]}" analyze --checkpoint "$WORK/train" --device "$DEVICE" --num-images 8 --output "$WORK/analysis"

echo "== 3. the depth study: $VARIANTS at depths $DEPTHS, $SEEDS seeds, $WORKERS runs at once per device"
if [ "$EXECUTOR" = ray ]; then
    WHERE=(--executor ray --gpus-per-run "$("$PY" -c "print(1 / $WORKERS)")")
    [ "$DEVICE" = cpu ] && WHERE=(--executor ray)
else
    WHERE=(--executor local --workers "$WORKERS")
fi
start=$(date +%s)
"${VITLAB[@]}" depth-study --dataset mnist-5k --depths "$DEPTHS" --variants "$VARIANTS" --seeds "$SEEDS" \
    --device "$DEVICE" "${WHERE[@]}" "${STUDY_SET[@]}" \
    $([ "$SMOKE" = 1 ] && echo "${TINY[@]} --num-images 8" || echo "--budget default --no-progress") \
    --output "$OUT"
echo "depth study: $(( $(date +%s) - start )) s wall; tables in $OUT (summary.csv, results.csv, index.html)"
[ "$SMOKE" = 1 ] || echo "next: python benchmarks/findings_tables.py --from-runs  (copies them into docs/results/)"
