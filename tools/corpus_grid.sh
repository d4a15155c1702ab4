#!/usr/bin/env bash
# Real text on one GPU, resumable across calls on the same machine (docs/experiments.md, "Real text"):
#   1. data/source_corpus from this machine's own site-packages and /usr/share/doc, 64k-token documents
#      (skipped once data/source_corpus/prepare.json exists);
#   2. experiment=corpus_attention: softmax, window w=1170 (power p=2's tiled state) and power p=2 at ctx 8192 x SEEDS, plus
#      power p=2 at ctx 65536, every point sharing the card (scripts/run_points.py, trainer.resume=auto);
#   3. passkey and needle retrieval for every point as soon as it has finished (while the others train; a point
#      whose retrieval was cut by END gets it on the next call);
#   4. the records a report needs (no checkpoints) -> $OUT/corpus_records.tgz, with prepare.json and the logs.
#   END=$(( $(date +%s) + 480 )) bash tools/corpus_grid.sh      # END: epoch seconds by which to be done
#   PHASE=prepare bash tools/corpus_grid.sh                     # step 1 alone
#   DIR=multirun/corpus_3000 EXTRA="trainer.max_steps=3000" END=... bash tools/corpus_grid.sh   # longer, own folder
# Run it again on the same machine and every point continues from its newest checkpoint.
source tools/setup_device.sh >/dev/null
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
END=${END:-$(( $(date +%s) + 480 ))}
SEEDS=${SEEDS:-0,1}
read -r -a EXTRA <<< "${EXTRA:-}"     # more train.py overrides for every point (CONTEXTS: the retrieval's)
INPUTS=${INPUTS:-"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') /usr/share/doc"}
DIR=${DIR:-multirun/corpus_attention}   # the runs' folder: another one for another recipe (EXTRA)
left() { echo $(( END - $(date +%s) )); }

if [ ! -f data/source_corpus/prepare.json ]; then
  # shellcheck disable=SC2086
  timer=(); [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)     # wall time and peak memory in the log
  "${timer[@]}" python3 scripts/prepare_dataset.py --group-by package --input $INPUTS \
    --out data/source_corpus --doc-len "${DOC_LEN:-65536}" --quiet > "$OUT/prepare.log" 2>&1 || { tail -20 "$OUT/prepare.log"; exit 1; }
fi
cp data/source_corpus/prepare.json "$OUT/"
[ "${PHASE:-all}" = prepare ] && exit 0

retrieval() {   # passkey and needle for one finished point (its train.log ends with "final (step ..."), side by side
  local run=$1 contexts=${CONTEXTS:-1024,4096,8192} task
  case "$run" in *ctx65536*) contexts=${CONTEXTS_64K:-1024,8192,65536};; esac
  for task in passkey needle; do
    ls "$run"/eval/$task-step*.json >/dev/null 2>&1 && continue
    [ "$(left)" -gt 25 ] || return 1
    timeout $(( $(left) - 20 )) python3 -m longctx.evaluate "$run" --task $task --contexts $contexts --no-wandb \
      >> "$OUT/retrieval_$(basename "$run").log" 2>&1 &
  done
  wait
  ls "$run"/eval/passkey-step*.json "$run"/eval/needle-step*.json >/dev/null 2>&1
}
watch_retrieval() {   # while the points train: each finished point's retrieval starts at once (they share the card)
  local over run
  while [ "$(left)" -gt 30 ]; do
    over=0; [ -e "$DIR/.training_over" ] && over=1
    for run in $DIR/*/; do
      grep -q "final (step" "$run/train.log" 2>/dev/null && [ ! -e "$run/.retrieval_started" ] || continue
      touch "$run/.retrieval_started"
      (retrieval "$run" || rm -f "$run/.retrieval_started") &
    done
    [ $over = 1 ] && break
    sleep 5
  done
  wait
}

# 30 s kept for packing; points that finish early get their retrieval while the others train
train_s=$(( $(left) - 30 ))
if [ "$train_s" -gt 30 ]; then
  mkdir -p $DIR; rm -f "$DIR/.training_over" $DIR/*/.retrieval_started
  watch_retrieval & watcher=$!
  common=(experiment=corpus_attention logger.wandb.mode=disabled trainer.keep_checkpoints=1 trainer.eval_every=50 "${EXTRA[@]}")
  python3 scripts/run_points.py --jobs 6 --dir $DIR --deadline-s "$train_s" "${common[@]}" \
    --grid seed="$SEEDS" --grid +experiment/arm=exp,window_tiled_state,power_p2 > "$OUT/corpus_ctx8192.log" 2>&1 &
  python3 scripts/run_points.py --jobs 1 --dir $DIR --deadline-s "$train_s" "${common[@]}" \
    +experiment/arm=power_p2 +experiment/ctx=c65536 trainer.micro_docs=1 > "$OUT/corpus_ctx65536.log" 2>&1
  wait $(jobs -p | grep -vx "$watcher")
  touch "$DIR/.training_over"
  tail -n 12 "$OUT/corpus_ctx8192.log" "$OUT/corpus_ctx65536.log"
  wait "$watcher"
fi
find $DIR \( -name metrics.jsonl -o -path '*/eval/*' -o -name stages.json -o -name config.yaml \
  -o -name provenance.json -o -name '*.log' \) -print0 | tar -czf "$OUT/corpus_records.tgz" --null -T -
ls -la "$OUT/corpus_records.tgz"; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
