#!/usr/bin/env bash
# The recall suite (experiment=recall_state) on one GPU, every point sharing the card (scripts/run_points.py) and
# resumable across calls: run it again on the same machine and each point continues from its newest checkpoint.
# Every point trains the recipe's two stages (16 pairs at ctx 64, then its N pairs at ctx 4096).
#   PILOT=1 DEADLINE_S=420 bash tools/recall_grid.sh   # softmax, power p=2 and linear at N = 64, one seed, lr 1e-3
#                                                       # and 3e-3 (PILOT_ARMS, PILOT_NPAIRS, PILOT_LRS): the step
#                                                       # time, whether each arm learns the first stage at either
#                                                       # rate, and whether softmax's recall nears 100% at ctx 4096
#   DEADLINE_S=480 bash tools/recall_grid.sh           # 7 arms x N in {64, 256, 1024} x 3 seeds (SEEDS, NPAIRS, ARMS)
#                                                       # x lr 1e-3 and 3e-3 (LRS; each rate its own folder; the
#                                                       # report draws each point at its best rate): whether a seed
#                                                       # leaves the first stage's plateau depends on the rate
#   ARMS=linear LRS=3e-4 DEADLINE_S=480 bash tools/recall_grid.sh   # arms at other rates (LRS= : the config's)
#   EXPERIMENT=recall_state_long NPAIRS=256 bash tools/recall_grid.sh   # ctx 16384 (into multirun/recall_state_long)
#   EXPERIMENT=recall_state_long NPAIRS=256 ARMS=exp LRS=3e-3 EXTRA="trainer.max_steps=1800" \
#       DIR=multirun/recall_state_long_1800 bash tools/recall_grid.sh    # a longer second stage, in its own folder
#   EXPERIMENT=recall_state_widths ARM_LRS=exp=3e-3,window=3e-3,power_p2=3e-3,linear=1e-3 bash tools/recall_grid.sh
#                                                       # widths as a second state axis: SIZES (default d64l2,d256l2,
#                                                       # d512l2; recall_state's own points are d128l2) at N = 256,
#                                                       # each arm at its own rate (ARM_LRS replaces ARMS and LRS)
# Each run holds ~2 GiB of the card: 24 at once fit, but not beside the 64k GPU tests (run those before or after).
# At the end (or the deadline) the records a report needs -- metrics.jsonl, each stage's newest eval/*.npz, stages.json,
# config.yaml, data_identity.json, provenance.json, no checkpoints -- are packed into $OUT/recall_records_n<N>.tgz (one
# per N), the points' logs into $OUT/recall_logs.tgz; unpack them in the repository's root, and
# `python -m longctx.report multirun/recall_state --out reports/recall --record docs/results/experiments/recall_state.json`
# then tables the accuracies and draws recall against state (plot_results redraws it from the record); runs made on
# another machine join an earlier record with `--carry OLD.json` (docs/experiments.md, "made by").
if [ -n "${ARM_LRS:-}" ]; then     # checked before anything is installed or written
  for pair in ${ARM_LRS//,/ }; do
    [[ $pair =~ ^[A-Za-z0-9_]+=[0-9.eE+-]+$ ]] || {
      echo "ARM_LRS=$ARM_LRS: '$pair' is not ARM=RATE (e.g. ARM_LRS=exp=3e-3,linear=1e-3)" >&2; exit 2; }
  done
  [ "${PILOT:-0}" = 1 ] && { echo "ARM_LRS=$ARM_LRS: the pilot grid takes PILOT_ARMS and PILOT_LRS" >&2; exit 2; }
fi
source tools/setup_device.sh >/dev/null
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-480}
EXPERIMENT=${EXPERIMENT:-recall_state}
if [ "$EXPERIMENT" = recall_state_widths ]; then     # one N; the model sizes are its grid
  NPAIRS=${NPAIRS:-256}; SIZES=${SIZES:-d64l2,d256l2,d512l2}
fi
read -r -a EXTRA <<< "${EXTRA:-}"     # more train.py overrides for every point (a longer second stage: its own DIR)
common=(experiment=$EXPERIMENT logger.wandb.mode=disabled trainer.keep_checkpoints=1 "${EXTRA[@]}")
if [ "${PILOT:-0}" = 1 ]; then
  grids=(--grid +experiment/arm=${PILOT_ARMS:-exp,power_p2,linear} --grid data.n_pairs=${PILOT_NPAIRS:-64} --grid seed=0
         --grid optim.lr=${PILOT_LRS:-1e-3,3e-3})
  common+=(trainer.max_steps=${PILOT_STEPS:-1000} trainer.eval_every=250)
  dir=multirun/recall_pilot
else
  # seeds the slowest axis (a grid cut short by the device's time has every arm at its first seeds), then the arms
  seeds=(--grid seed=${SEEDS:-0,1,2})
  rest=(--grid data.n_pairs=${NPAIRS:-64,256,1024})
  [ -n "${SIZES:-}" ] && rest+=(--grid +experiment/size=$SIZES)
  LRS=${LRS-1e-3,3e-3}
  [ -n "$LRS" ] && rest_lrs=(--grid optim.lr=$LRS) || rest_lrs=()
  grids=("${seeds[@]}" --grid +experiment/arm=${ARMS:-exp,window,power_p2,power_p3,power_p4,linear,window_linear_state}
         "${rest[@]}" "${rest_lrs[@]}")
  dir=${DIR:-multirun/$EXPERIMENT}
fi
points() {  # $1: jobs, $2: log name, then grid arguments
  local jobs=$1 log=$2; shift 2
  python3 scripts/run_points.py --jobs "$jobs" --dir "$dir" --deadline-s "$DEADLINE_S" "${common[@]}" "$@" \
    > "$OUT/$log" 2>&1
  tail -30 "$OUT/$log"
}
if [ -n "${ARM_LRS:-}" ]; then
  # each arm at its own rate (ARM_LRS="exp=3e-3,window=3e-3,linear=1e-3": the arms' better rates), one run_points per
  # rate side by side in the same folder, JOBS shared between them by their number of arms
  declare -A arms_at=()
  for pair in ${ARM_LRS//,/ }; do arms_at[${pair#*=}]+=${arms_at[${pair#*=}]:+,}${pair%%=*}; done
  n_arms=$(tr ',' '\n' <<< "$ARM_LRS" | wc -l)
  for lr in "${!arms_at[@]}"; do
    n=$(tr ',' '\n' <<< "${arms_at[$lr]}" | wc -l)
    points $(( (${JOBS:-18} * n + n_arms - 1) / n_arms )) "recall_grid_lr$lr.log" \
      "${seeds[@]}" --grid +experiment/arm=${arms_at[$lr]} "${rest[@]}" --grid optim.lr=$lr &
  done
  wait
else
  points ${JOBS:-18} recall_grid.log "${grids[@]}"
fi
# one archive per N, each stage's newest per-document record only (the one a report reads: the earlier ones would
# triple the size), and the points' logs in their own
ns=${NPAIRS:-64,256,1024}; [ "${PILOT:-0}" = 1 ] && ns=${PILOT_NPAIRS:-64}
for n in ${ns//,/ }; do
  { find "$dir" -path "*_mqar_n${n}_*" \( -name metrics.jsonl -o -name stages.json -o -name config.yaml \
      -o -name data_identity.json -o -name provenance.json \) -print0
    find "$dir" -path "*_mqar_n${n}_*" -type d -name eval | while read -r ev; do
      newest=$(ls "$ev"/*.npz 2>/dev/null | sort | tail -1); [ -n "$newest" ] && printf '%s\0' "$newest"
    done
  } | tar -czf "$OUT/recall_records_n$n.tgz" --null -T -
done
[ -d "$dir/logs" ] && tar -czf "$OUT/recall_logs.tgz" "$dir/logs"
ls -la "$OUT"/recall_*.tgz; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
