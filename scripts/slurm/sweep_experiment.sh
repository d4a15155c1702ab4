#!/usr/bin/env bash
# One paper experiment (conf/experiment/<NAME>.yaml) as one command: every point of its sweep, one wandb group.
#
#   scripts/slurm/sweep_experiment.sh NAME [--launcher local|slurm] [--dry-run] [hydra overrides ...]
#
# Run from the repository root. NAME is a sweep of conf/experiment/ (e.g. attention_equal_state,
# context_scaling, flops_frontier, reshape_ablation, icl_vs_batch, icl_vs_params, best_context_table, or
# their *_paper versions, which need data.path=/data/longcrawl64). The runs land in multirun/NAME/<date>/;
# `python -m longctx.report multirun/NAME/<date> --out reports/NAME` compares them.
#
# Launchers:
#   local (default)  Hydra's basic launcher: the points one after another on this machine (one GPU)
#   slurm            hydra/launcher=submitit_slurm: one Slurm array, one job (one GPU) per point; the command
#                    waits until the jobs end (run it in tmux/screen)
# Environment for slurm (all optional): PARTITION ACCOUNT QOS CONSTRAINT TIMEOUT_MIN(4320) CPUS_PER_TASK(8)
#   MEM_GB ARRAY_PARALLELISM; PYTHON (python) for both.
#
# Examples:
#   scripts/slurm/sweep_experiment.sh attention_equal_state
#   scripts/slurm/sweep_experiment.sh context_scaling +experiment/arm=exp     # only the softmax points
#   PARTITION=gpu scripts/slurm/sweep_experiment.sh attention_equal_state_paper --launcher slurm \
#       data.path=/data/longcrawl64 logger.wandb.mode=online
set -euo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

NAME=${1:-}
[[ -z $NAME || $NAME == -h || $NAME == --help ]] && usage 0
shift
if [[ ! -f conf/experiment/$NAME.yaml ]]; then
  echo "sweep_experiment.sh: no conf/experiment/$NAME.yaml (run from the repository root); known:" \
       "$(ls conf/experiment/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
  exit 2
fi
LAUNCHER=local
DRY_RUN=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --launcher) LAUNCHER=${2:?--launcher needs local or slurm}; shift 2 ;;
    --launcher=*) LAUNCHER=${1#--launcher=}; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

CMD=("${PYTHON:-python}" train.py -m "experiment=$NAME")
case $LAUNCHER in
  local) ;;
  slurm)
    CMD+=(hydra/launcher=submitit_slurm "hydra.launcher.timeout_min=${TIMEOUT_MIN:-4320}"
          "hydra.launcher.cpus_per_task=${CPUS_PER_TASK:-8}" hydra.launcher.tasks_per_node=1
          hydra.launcher.gpus_per_node=1 "hydra.launcher.name=$NAME")
    [[ -n ${PARTITION:-} ]] && CMD+=("hydra.launcher.partition=$PARTITION")
    [[ -n ${ACCOUNT:-} ]] && CMD+=("hydra.launcher.account=$ACCOUNT")
    [[ -n ${QOS:-} ]] && CMD+=("hydra.launcher.qos=$QOS")
    [[ -n ${CONSTRAINT:-} ]] && CMD+=("hydra.launcher.constraint=$CONSTRAINT")
    [[ -n ${MEM_GB:-} ]] && CMD+=("hydra.launcher.mem_gb=$MEM_GB")
    [[ -n ${ARRAY_PARALLELISM:-} ]] && CMD+=("hydra.launcher.array_parallelism=$ARRAY_PARALLELISM")
    ;;
  *) echo "sweep_experiment.sh: unknown launcher '$LAUNCHER' (local, slurm)" >&2; exit 2 ;;
esac
CMD+=("${EXTRA[@]}")
printf '%q ' "${CMD[@]}"; echo
[[ $DRY_RUN -eq 1 ]] || exec "${CMD[@]}"
