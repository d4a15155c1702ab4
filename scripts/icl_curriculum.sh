#!/usr/bin/env bash
# The calibrated long-context ICL recipe (docs/experiments.md, "The long-context task"): a short-context stage
# forms the in-context circuit (512 documents of 1024 tokens per update), then the same weights train at the full
# context (128 documents of 4096 tokens per update; trainer.init_from: new optimizer and schedule). Both stages
# see 524,288 tokens per update on the GPT-2 d256l4 recipe (experiment=icl_small) and a 16,384-document train set.
#
#   scripts/icl_curriculum.sh OUT_DIR [hydra overrides for both stages ...]
#
# The stages land in OUT_DIR/stage1_ctx1024 and OUT_DIR/stage2_ctx4096; a relaunch continues whichever stage
# was interrupted (trainer.resume=auto) and skips a finished one. Stage lengths: STAGE1_STEPS (400) and
# STAGE2_STEPS (1500) in the environment; STAGE0_STEPS > 0 (default 0) adds a first stage at ctx 256 (2048
# documents per update, OUT_DIR/stage0_ctx256) that stage 1 starts from; WHOLE_DOCS=1 (default 0) trains the short
# stages on documents as long as their context instead of windows of the 4096-token ones; PYTHON (python).
#
# Examples:
#   scripts/icl_curriculum.sh runs/icl_exp attention=exp
#   scripts/icl_curriculum.sh runs/icl_power attention=power p=2 logger.wandb.mode=online
#   python -m longctx.report runs/icl_exp/stage2_ctx4096 runs/icl_power/stage2_ctx4096 --out reports/icl
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
OUT_DIR=${1:-}
[[ $OUT_DIR == -h || $OUT_DIR == --help ]] && usage 0
[[ -z $OUT_DIR || $OUT_DIR == *=* ]] && { echo "icl_curriculum.sh: the first argument is the output folder" \
  "(got '${OUT_DIR}'); overrides follow it" >&2; usage 2 >&2; }
shift
PYTHON=${PYTHON:-python}
common=(experiment=icl_small data.train_tokens=67108864 trainer.eval_every=100 trainer.resume=auto)
# WHOLE_DOCS=1: every training window of the short stages starts a document, as every evaluation window does;
# 0: windows of the 4096-token documents, 3 in 4 of stage 1's starting mid-document (better for long positions)
whole0=(); whole1=()
(( ${WHOLE_DOCS:-0} )) && { whole0=(data.doc_len=256); whole1=(data.doc_len=1024); }
stage1_init=()
if (( ${STAGE0_STEPS:-0} > 0 )); then
  "$PYTHON" train.py "${common[@]}" ctx=256 "${whole0[@]}" data.docs_per_batch=2048 trainer.max_steps="$STAGE0_STEPS" \
    "$@" hydra.run.dir="$OUT_DIR/stage0_ctx256"
  stage1_init=(trainer.init_from="$OUT_DIR/stage0_ctx256")
fi
"$PYTHON" train.py "${common[@]}" ctx=1024 "${whole1[@]}" data.docs_per_batch=512 trainer.max_steps="${STAGE1_STEPS:-400}" \
  "${stage1_init[@]}" "$@" hydra.run.dir="$OUT_DIR/stage1_ctx1024"
"$PYTHON" train.py "${common[@]}" ctx=4096 data.docs_per_batch=128 trainer.max_steps="${STAGE2_STEPS:-1500}" \
  trainer.init_from="$OUT_DIR/stage1_ctx1024" "$@" hydra.run.dir="$OUT_DIR/stage2_ctx4096"
