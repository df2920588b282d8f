#!/usr/bin/env bash
# On a machine with a CUDA GPU: check the CUDA paths of train / eval / analyze (fused attention, bf16 autocast,
# torch.compile), then run the depth study of docs/findings.md with many runs per GPU, into runs/findings/depth
# (where `python scripts/findings_tables.py --from-runs` reads it for docs/findings.md).
#
#   scripts/gpu_study.sh                 # on the GPU: checks, then the whole study (hours)
#   scripts/gpu_study.sh --smoke         # anywhere, on the CPU, in seconds: every step end to end, tiny
#
# Then, in this order (STUDIES picks, default "budget lr fashion depth"; STUDIES= set empty runs the checks alone):
# the rate x depth study of docs/findings.md section 10 on the whole Fashion-MNIST training set (scripts/
# depth_budget.sh with FULL=1 DEVICE=cuda: the page's second table, beside the CPU's 10,000-image one; BUDGET_OUT,
# default runs/findings_full; PHASES picks its phases), the learning-rate sensitivity study of docs/findings.md section 7 (runs/lr_sensitivity), the Fashion-MNIST depth
# study of section 8 at the rates it chose, trained to the recipe (20 epochs, with CaiT: section 9's design;
# section 8 itself ran 3 epochs on the CPU) (runs/findings/depth_fashion_recipe; needs apt-get install
# dataset-fashion-mnist), the depth study (OUT).
#
# Settings (environment): OUT (study folder; default runs/findings/depth, smoke: a temporary folder), LR_OUT and
# FASHION_OUT (the other two studies' folders), FASHION_DIR (the idx files; default the Debian package's),
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
STUDIES=${STUDIES-budget lr fashion depth}  # set but empty: the checks alone (":-" would run every study)
FASHION_DIR=${FASHION_DIR:-/usr/share/datasets/fashion-mnist}

if [ "$SMOKE" = 1 ]; then
    DEVICE=cpu
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    OUT=${OUT:-$WORK/depth}
    TINY=(--limit-train 64 --limit-test 32 --batch-size 16 --epochs 1 --threads 1 --no-progress)
    DEPTHS=1,2; VARIANTS=vit,layerscale; SEEDS=1; WORKERS=1
    STUDY_SET=(--set embed_dim=16 --set num_heads=2)
    LR_OUT=${LR_OUT:-$WORK/lr_sensitivity}; FASHION_OUT=${FASHION_OUT:-$WORK/depth_fashion}
    BUDGET_OUT=${BUDGET_OUT:-$WORK/budget}
    FASHION_DATA=(--dataset mnist-5k)  # the smoke test runs offline anywhere: the same step on the shipped digits
    LR_ARGS=(--depths 1,2 --variants vit,tfixup --lrs 1e-3,3e-3 --seeds 1 --val-split 0.25 --probe-images 8
             "${TINY[@]}" "${STUDY_SET[@]}")
    FASHION_ARGS=(--depths 1,2 --variants vit --seeds 1 --val-split 0.1 --num-images 4 "${TINY[@]}"
                  "${STUDY_SET[@]}")
else
    DEVICE=cuda
    WORK=runs/gpu_check
    OUT=${OUT:-runs/findings/depth}
    TINY=(--epochs 1 --no-progress)
    DEPTHS=6,12,24,36; VARIANTS=vit,layerscale,rezero,skipinit,fixup,tfixup,cait,deepvit
    STUDY_SET=()
    LR_OUT=${LR_OUT:-runs/lr_sensitivity}; FASHION_OUT=${FASHION_OUT:-runs/findings/depth_fashion_recipe}
    BUDGET_OUT=${BUDGET_OUT:-runs/findings_full}
    FASHION_DATA=(--dataset fashion-mnist --data-dir "$FASHION_DIR")
    LR_ARGS=(--depths 6,12,24,48 --lrs 3e-4,7e-4,2e-3,5e-3,1e-2 --variants vit,layerscale,cait,deepvit,rezero,fixup,tfixup
             --seeds 3 --epochs 3 --run-set warmup_epochs=1 --no-augment --val-split 0.1 --no-progress)
    FASHION_ARGS=(--depths 6,12,24 --variants vit,layerscale,cait --seeds 3 --val-split 0.1 --no-progress)
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

if [ "$EXECUTOR" = ray ]; then
    WHERE=(--executor ray --gpus-per-run "$("$PY" -c "print(1 / $WORKERS)")")
    [ "$DEVICE" = cpu ] && WHERE=(--executor ray)
else
    WHERE=(--executor local --workers "$WORKERS")
fi
if [[ " $STUDIES " == *" budget "* ]]; then
    echo "== 3. the rate x depth study (docs/findings.md section 10), the whole training set, into $BUDGET_OUT"
    start=$(date +%s)
    if [ "$SMOKE" = 1 ]; then  # phases 1 and 2 at one block on 64 digits: every command of the script, in seconds
        PHASES="1:1 2:1" DEVICE=cpu WORKERS=1 OUT="$BUDGET_OUT" PYTHON="$PY" D="$WORK/no_data" \
            EXTRA="--dataset mnist-5k --limit-train 64 --limit-test 32 --batch-size 16 --epochs 1 --val-split 0.25
                   --probe-images 8 ${STUDY_SET[*]}" bash scripts/depth_budget.sh
    else
        FULL=1 DEVICE=cuda WORKERS="$WORKERS" OUT="$BUDGET_OUT" PYTHON="$PY" bash scripts/depth_budget.sh
    fi
    echo "rate x depth study: $(( $(date +%s) - start )) s wall"
fi
if [[ " $STUDIES " == *" lr "* ]]; then
    echo "== 3a. learning-rate sensitivity against depth (docs/findings.md section 7) into $LR_OUT"
    start=$(date +%s)
    "${VITLAB[@]}" lr-sensitivity "${LR_ARGS[@]}" --device "$DEVICE" "${WHERE[@]}" --output "$LR_OUT"
    echo "lr sensitivity: $(( $(date +%s) - start )) s wall"
fi
if [[ " $STUDIES " == *" fashion "* ]]; then
    echo "== 3b. does depth pay off on Fashion-MNIST, at the rates of $LR_OUT, into $FASHION_OUT"
    start=$(date +%s)
    "${VITLAB[@]}" depth-study "${FASHION_DATA[@]}" --lr-from "$LR_OUT" \
        "${FASHION_ARGS[@]}" --device "$DEVICE" "${WHERE[@]}" --output "$FASHION_OUT"
    echo "fashion depth study: $(( $(date +%s) - start )) s wall"
fi
[[ " $STUDIES " == *" depth "* ]] || exit 0
echo "== 3. the depth study: $VARIANTS at depths $DEPTHS, $SEEDS seeds, $WORKERS runs at once per device"
start=$(date +%s)
"${VITLAB[@]}" depth-study --dataset mnist-5k --depths "$DEPTHS" --variants "$VARIANTS" --seeds "$SEEDS" \
    --device "$DEVICE" "${WHERE[@]}" "${STUDY_SET[@]}" \
    $([ "$SMOKE" = 1 ] && echo "${TINY[@]} --num-images 8" || echo "--budget default --no-progress") \
    --output "$OUT"
echo "depth study: $(( $(date +%s) - start )) s wall; tables in $OUT (summary.csv, results.csv, index.html)"
[ "$SMOKE" = 1 ] || echo "next: python scripts/findings_tables.py --from-runs  (copies them into docs/results/)"
