#!/usr/bin/env bash
# The calibrated long-context ICL recipe (docs/experiments.md, "The long-context task"), conf/experiment/
# icl_curriculum.yaml run into one folder: a short-context stage forms the in-context circuit (512 documents of 1024
# tokens per update), then the same weights train at the full context (128 documents of 4096 tokens per update;
# trainer.init_from: new optimizer and schedule). This script is a thin wrapper of
#
#   python train.py experiment=icl_curriculum trainer.resume=auto hydra.run.dir=OUT_DIR [overrides ...]
#
#   scripts/icl_curriculum.sh OUT_DIR [hydra overrides for every stage ...]
#
# The stages land in OUT_DIR/stage1_ctx1024 and OUT_DIR/stage2_ctx4096 (the result); a relaunch continues whichever
# stage was interrupted and skips a finished one. Stage lengths: STAGE1_STEPS (400, short_stage_steps) and
# STAGE2_STEPS (1500, trainer.max_steps) in the environment; STAGE0_STEPS > 0 (default 0) adds a first stage at
# ctx 256 (2048 documents per update) in front, so the stages become OUT_DIR/stage1_ctx256, stage2_ctx1024 and
# stage3_ctx4096; WHOLE_DOCS=1 (default 0) trains the short stages on documents as long as their context instead
# of windows of the 4096-token ones; PYTHON (python).
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
steps1=${STAGE1_STEPS:-400}
args=(experiment=icl_curriculum trainer.resume=auto "hydra.run.dir=$OUT_DIR" "short_stage_steps=$steps1")
[[ -n ${STAGE2_STEPS:-} ]] && args+=("trainer.max_steps=$STAGE2_STEPS")
# The recipe's stages unless a ctx-256 stage goes in front or the short stages read whole documents
if (( ${STAGE0_STEPS:-0} > 0 )) || (( ${WHOLE_DOCS:-0} )); then
  whole0=''; whole1=''
  (( ${WHOLE_DOCS:-0} )) && { whole0=',data.doc_len:256'; whole1=',data.doc_len:1024'; }
  stages="{ctx:1024,data.docs_per_batch:512,trainer.max_steps:${steps1}${whole1}},{}"
  (( ${STAGE0_STEPS:-0} > 0 )) && \
    stages="{ctx:256,data.docs_per_batch:2048,trainer.max_steps:${STAGE0_STEPS}${whole0}},$stages"
  args+=("trainer.stages=[$stages]")
fi
exec "${PYTHON:-python}" train.py "${args[@]}" "$@"
