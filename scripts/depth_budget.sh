#!/usr/bin/env bash
# The rate x depth study of docs/findings.md section 10, every phase in the order the design runs them. Each phase
# reads back the runs that finished, so the same command resumes after any stop (restore committed records first:
# `python scripts/findings_tables.py docs/findings.md --restore-runs docs/results/runs runs/findings`; a later phase
# alone, PHASES="3", then first writes the grid's table from the restored runs, which phases 2-4 read its rates from).
#
#   bash scripts/depth_budget.sh            # all phases, two worker processes of one thread each
#   WORKERS=1 bash scripts/depth_budget.sh  # one worker (leaves a core free for other work)
#   PHASES="2:6,12 3" bash scripts/depth_budget.sh   # some phases; PHASE:DEPTHS limits phase 1, 2, 3 or 5 to depths
#                                           # (5:6 trains phase 5's short runs first, to end a session on them)
#   PHASES="1:24:vit,qknorm 2:24:vit,qknorm" ...     # PHASE:DEPTHS:ARMS limits phase 1 or 2 to some arms too;
#                                           # after a phase 1 or 2 step over some cells, the phase's tables are
#                                           # rewritten from every cell finished so far (--finished-only)
#   DRY_RUN=1 bash scripts/depth_budget.sh  # each command's --dry-run: the runs it would train, nothing written;
#                                           # a phase that needs runs not finished yet says so and the next is planned
#   FULL=1 DEVICE=cuda WORKERS=4 OUT=runs/findings_full bash scripts/depth_budget.sh   # the GPU's second table
#
# FULL=1 trains on the whole training set (55,000 images; the same 5,000 held out for validation: --val-split
# 0.08334, stratified) instead of the small-data draw; DEVICE=cuda runs on the GPU (--device cuda, no --threads);
# EXTRA appends options to every command (the smoke test of scripts/gpu_study.sh shrinks the runs with it).
#
# Phases: 1 the rate grid (seed 0, 5 rates, --bracket 3 adds rates beyond an edge best; --diagnose writes each run's
# diagnostics, so its record kept without weights can still be copied); 2 five seeds at each cell's best rate (seed 0
# copied from the grid); 3 the same-rate control (each arm at the ViT's rate, the ViT's own runs and
# those of an arm whose rate is the ViT's copied from phase 2); 4 drop-path 0.1, uniform and linear, at 24 blocks for
# the arm with the best phase-2 validation accuracy there (scripts/verdicts.py best_arm; never the test set);
# 5 Wortsman et al.'s claims: the grid at seeds 0-2 for the plain ViT and QK-layernorm at 6 and 24 blocks (seed 0
# copied from phase 1 at the grid's rates). The default order runs phases 1 and 2 to 12 blocks first, so the shallow
# cells' verdicts come before the 24-block grid's hours; then at 24 blocks two arms at a time, grid then seeds (the
# ViT and QK-layernorm, then LayerScale and CaiT, then DeepViT), so the first 24-block verdicts wait for two arms'
# runs, not for all five grids; each cell's rate is its own grid's either way.
# Data: `apt-get install dataset-fashion-mnist`.
{  # read whole before it runs: a `git pull` while the study runs cannot change the running script
set -euo pipefail
cd "$(dirname "$0")/.."
D=${D:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-runs/findings}
WORKERS=${WORKERS:-2}
PHASES=${PHASES:-1:6,12 2:6,12 1:24:vit,qknorm 2:24:vit,qknorm 1:24:layerscale,cait 2:24:layerscale,cait \
1:6,12,24 2:6,12,24 3 4 5}
PYTHON=${PYTHON:-python}
VITLAB=(${VITLAB:-$PYTHON -m vitlab})
ARMS=vit,qknorm,layerscale,cait,deepvit
GRID=$OUT/depth_budget_grid
DEVICE=${DEVICE:-cpu}
DATA=(--limit-train 15000 --val-split 0.33334)
[ -n "${FULL:-}" ] && DATA=(--val-split 0.08334)
WHERE=(--threads 1)
[ "$DEVICE" != cpu ] && WHERE=(--device "$DEVICE")
COMMON=(${DRY_RUN:+--dry-run} --dataset fashion-mnist --data-dir "$D" --base vit_mnist "${DATA[@]}"
        --run-set stratify=true --epochs 50 "${WHERE[@]}" --workers "$WORKERS" --no-progress ${EXTRA:-})
RATES=(--lrs 5e-4,1e-3,2e-3,4e-3,8e-3 --bracket 3)
UNPLANNED=()
step() {  # one command of a phase; a dry run goes on past a phase whose inputs are not finished (exit 2 at the end)
  if [ -z "${DRY_RUN:-}" ]; then
    "$@"
  elif ! "$@"; then
    echo "depth_budget.sh: dry run: phase $item cannot be planned yet (above); planning the next" >&2
    UNPLANNED+=("$item")
  fi
}

ALL=(--depths 6,12,24 --variants $ARMS --finished-only)  # a phase's whole table, from the cells finished so far
REBUILT=
grid_table() {  # phases 2-4 read the grid's rates from its sensitivity.csv (--lr-from); a machine that has only the
  # committed run records (--restore-runs brings back runs, not the tables) writes it from them first, training nothing
  if [ -n "$REBUILT" ] || [ -f "$GRID/sensitivity.csv" ] || ! compgen -G "$GRID/*/summary.json" > /dev/null; then
    return 0
  fi
  REBUILT=1
  if [ -n "${DRY_RUN:-}" ]; then
    echo "depth_budget.sh: dry run: $GRID has finished runs but no sensitivity.csv (restored records); a real run" \
         "writes it from them first (training nothing), then phase $item can be planned" >&2
    return 0
  fi
  echo "depth_budget.sh: $GRID has no sensitivity.csv; writing it from the grid's finished runs (nothing trains)" >&2
  "${VITLAB[@]}" lr-sensitivity "${COMMON[@]}" "${ALL[@]}" "${RATES[@]}" --seeds 1 --diagnose --output "$GRID"
}
for item in $PHASES; do
  IFS=: read -r phase depths arms extra <<< "$item"
  whole=6,12,24  # the depths of the phase's whole table
  [ "$phase" = 5 ] && whole=6,24
  depths=${depths:-$whole}
  part=  # a phase 1, 2 or 5 step over some cells rewrites its folder's tables with those cells only: then rewrite them
  { [ -n "$arms" ] || [ "$depths" != "$whole" ]; } && part=1
  for d in ${depths//,/ }; do  # a step at other depths (the GPU script's smoke test: 1 block) has no whole table
    case ,$whole, in *,$d,*) ;; *) part= ;; esac
  done
  if [ "$phase" = 5 ] && [ -z "$part" ] && [ "$depths" != "$whole" ]; then
    echo "depth_budget.sh: $item: phase 5 runs at 6 and 24 blocks (5:6, 5:24 or 5)" >&2
    exit 2
  fi
  if [ -n "$extra" ] || { [ -n "$arms" ] && [ "$phase" != 1 ] && [ "$phase" != 2 ]; }; then
    echo "depth_budget.sh: $item: only phases 1 and 2 take arms (PHASE:DEPTHS:ARMS, e.g. 1:24:vit,qknorm)" >&2
    exit 2
  fi
  case $phase in 2|3|4) grid_table ;; esac
  case $phase in
  1)  # each invocation with more depths adds them to the same folder; finished runs are read back
    step "${VITLAB[@]}" lr-sensitivity "${COMMON[@]}" --depths "$depths" --variants "${arms:-$ARMS}" "${RATES[@]}" \
        --seeds 1 --diagnose --output "$GRID"
    if [ -n "$part" ] && [ -z "${DRY_RUN:-}" ]; then
      step "${VITLAB[@]}" lr-sensitivity "${COMMON[@]}" "${ALL[@]}" "${RATES[@]}" --seeds 1 --diagnose --output "$GRID"
    fi ;;
  2)
    step "${VITLAB[@]}" depth-study "${COMMON[@]}" --depths "$depths" --variants "${arms:-$ARMS}" --seeds 5 \
        --lr-from "$GRID" --output "$OUT/depth_budget"
    if [ -n "$part" ] && [ -z "${DRY_RUN:-}" ]; then
      step "${VITLAB[@]}" depth-study "${COMMON[@]}" "${ALL[@]}" --seeds 5 --lr-from "$GRID" --output "$OUT/depth_budget"
    fi ;;
  3)
    step "${VITLAB[@]}" depth-study "${COMMON[@]}" --depths "$depths" --variants qknorm,layerscale,cait,deepvit \
        --seeds 5 --lr-from "$GRID" --lr-of vit --reuse "$OUT/depth_budget" --output "$OUT/depth_budget_same_rate" ;;
  4)
    best=$(PYTHONPATH=scripts "$PYTHON" -c "import sys; from pathlib import Path; import verdicts; \
print(verdicts.best_arm(Path(sys.argv[1])) or '')" "$OUT")
    if [ -z "$best" ]; then
      echo "depth_budget.sh: phase 4 needs phase 2's 24-block runs (5 seeds of every arm) to choose its arm" >&2
      [ -z "${DRY_RUN:-}" ] && exit 2
      UNPLANNED+=("$item")
      continue
    fi
    for rule in uniform linear; do
      step "${VITLAB[@]}" depth-study "${COMMON[@]}" --depths 24 --variants "$best" --seeds 5 --lr-from "$GRID" \
          --run-set drop_path=0.1 --run-set drop_path_rule=$rule --output "$OUT/depth_budget_dp_$rule"
    done ;;
  5)
    [ -z "${DRY_RUN:-}" ] && mkdir -p "$OUT/depth_budget_wortsman"
    # seed 0: phase 1's runs at the grid's own rates (--lrs, as run folders name them), verified when read back. A
    # rate phase 1 added beyond an edge is not copied: this study's --bracket adds it, for every seed, only if its own
    # 3-seed curve asks for it, and a curve's LR sensitivity counts only the seeds that finished all of its rates
    seed0=()
    for r in $("$PYTHON" -c "import sys; print(*(f'{float(r):g}' for r in sys.argv[1].split(',')))" "${RATES[1]}"); do
      seed0+=("$GRID"/{vit,qknorm}_depth{6,24}_lr"$r"_seed0)
    done
    for run in "${seed0[@]}"; do
      [ -z "${DRY_RUN:-}" ] && [ -d "$run" ] && [ ! -e "$OUT/depth_budget_wortsman/$(basename "$run")" ] && \
        cp -r "$run" "$OUT/depth_budget_wortsman/.$(basename "$run").cp" && \
        mv "$OUT/depth_budget_wortsman/.$(basename "$run").cp" "$OUT/depth_budget_wortsman/$(basename "$run")"
    done
    step "${VITLAB[@]}" lr-sensitivity "${COMMON[@]}" --depths "$depths" --variants vit,qknorm "${RATES[@]}" --seeds 3 \
        --output "$OUT/depth_budget_wortsman"
    if [ -n "$part" ] && [ -z "${DRY_RUN:-}" ]; then
      step "${VITLAB[@]}" lr-sensitivity "${COMMON[@]}" --depths "$whole" --variants vit,qknorm "${RATES[@]}" \
          --seeds 3 --finished-only --output "$OUT/depth_budget_wortsman"
    fi
    if [ -n "${DRY_RUN:-}" ]; then
      found=0
      for run in "${seed0[@]}"; do
        if [ -d "$run" ]; then found=$((found + 1)); fi
      done
      echo "depth_budget.sh: dry run: phase 5 copies phase 1's seed-0 runs of these cells ($found there now) before" \
           "it trains; the plan above counts those not copied yet as runs to train" >&2
    fi ;;
  *) echo "depth_budget.sh: unknown phase $item; choose from 1 2 3 4 5 (1-3 and 5 may name depths: 2:6,12, 5:6;" \
          "1-2 arms too: 1:24:vit,qknorm)" >&2
     exit 2 ;;
  esac
done
if [ ${#UNPLANNED[@]} -gt 0 ]; then
  echo "depth_budget.sh: dry run: phase(s) ${UNPLANNED[*]} cannot be planned until the runs they read have finished" >&2
  exit 2
fi
exit 0
}
