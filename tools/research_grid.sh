#!/usr/bin/env bash
# The small staged sweeps on one GPU, every point sharing the card (scripts/run_points.py), resumable across calls:
# run it again on the same machine and each point continues from its newest checkpoint. At the end (or the
# deadline) the records a report needs -- metrics.jsonl, eval/*.npz, stages.json, config.yaml, provenance.json and
# the points' logs, no checkpoints -- are packed into $OUT/records.tgz.
#   DEADLINE_S=480 bash tools/research_grid.sh   # (a) equal state, 6 arms x 3 seeds; (b) softmax @1024 x 3 seeds
# At most ~16 of these runs fit one H200 at once (about 8 GB each at the stage-2 switch); JOBS_A sets how many.
source tools/setup_device.sh >/dev/null
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-480}
common=(+experiment/scale=quarter_batch logger.wandb.mode=disabled trainer.keep_checkpoints=1)
python3 scripts/run_points.py --jobs ${JOBS_A:-13} --dir multirun/equal_state --deadline-s "$DEADLINE_S" \
  experiment=attention_equal_state "${common[@]}" --grid seed=0,1,2 \
  --grid +experiment/arm=exp,window_tiled_state,power_p2,power_p4,linear,window_linear_state > "$OUT/equal_state.log" 2>&1 &
python3 scripts/run_points.py --jobs 3 --dir multirun/best_context_table --deadline-s "$DEADLINE_S" \
  experiment=best_context_table "${common[@]}" --grid seed=0,1,2 --grid +experiment/table=exp \
  > "$OUT/best_context_table.log" 2>&1 &
wait
tail -25 "$OUT/equal_state.log" "$OUT/best_context_table.log"
find multirun/equal_state multirun/best_context_table \( -name metrics.jsonl -o -name '*.npz' -o -name stages.json \
  -o -name config.yaml -o -name provenance.json -o -name '*.log' \) -print0 | tar -czf "$OUT/records.tgz" --null -T -
ls -la "$OUT/records.tgz"; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
