#!/usr/bin/env bash
# The paper's training grids (attention x context x model size), each one wandb group.
#
#   scripts/slurm/sweep_paper.sh GRID [--launcher slurm|sbatch|local] [--dry-run] [hydra overrides ...]
#
# Run from the repository root. GRIDs (wandb group = paper-<GRID>-<ARCH> unless GROUP is set):
#   main     attention=exp,linear,window,power (p=2) x ctx=1024,8192,65536 x model=small,medium,large
#            on LongCrawl64: 36 runs (the paper's attention x context x size comparison)
#   ctx      attention=exp,linear,window,power x ctx=1024,2048,4096,8192,16384,32768,65536, model=small:
#            28 runs (loss/ICL vs context length at fixed size)
#   reshape  attention=power x ctx=1024,8192,65536 with data.reshape_block=1024: 3 runs (the paper's
#            "fooled by context" ablation: same tokens, no long context; compare with `ctx`)
#   smoke    the tiny CPU default on the bundled ICL Markov data: attention x ctx=128,256, 200 steps, window 64.
#            8 runs, minutes each; checks a cluster setup end to end before spending GPU hours
#
# Launchers:
#   slurm (default)  `python train.py -m hydra/launcher=submitit_slurm ...`: one Slurm array, one job
#                    per grid point (1 GPU each). The command waits until all jobs end (run it in
#                    tmux/screen); the jobs themselves are Slurm's and keep running if it is stopped.
#   sbatch           one `sbatch scripts/slurm/sbatch_ddp.sh <point's overrides>` per grid point:
#                    for points that need several GPUs or nodes (set SBATCH_ARGS, e.g.
#                    "--nodes=2 --gpus-per-node=8 --time=2-00:00:00"). Returns after submitting.
#   local            the same multirun with Hydra's basic launcher: the points one after another on
#                    this machine (what a laptop or a single GPU box does).
#
# Environment (all optional):
#   ARCH=gpt2|rwkv7 (gpt2)  DATA_PATH=/data/longcrawl64 (required except for smoke)  GROUP=<wandb group>
#   SEEDS=0 (comma list)    WINDOW=<sliding window for attention=window> (config default)
#   submitit (--launcher slurm): PARTITION ACCOUNT QOS CONSTRAINT TIMEOUT_MIN(4320) GPUS_PER_NODE(1; 0=CPU)
#                                CPUS_PER_TASK(8) MEM_GB ARRAY_PARALLELISM  (one GPU per job: use
#                                --launcher sbatch for more)
#   sbatch   (--launcher sbatch): SBATCH_ARGS (passed to sbatch before the script)
#   PYTHON (python): the interpreter that runs train.py
#
# Examples:
#   DATA_PATH=/data/longcrawl64 PARTITION=gpu scripts/slurm/sweep_paper.sh main logger.wandb.mode=online
#   scripts/slurm/sweep_paper.sh smoke --launcher local
#   DATA_PATH=/data/lc64 SBATCH_ARGS="--nodes=1 --gpus-per-node=8" scripts/slurm/sweep_paper.sh ctx --launcher sbatch
#   scripts/slurm/sweep_paper.sh main --dry-run          # print the command(s) only
set -euo pipefail

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

GRID=${1:-}
[[ -z $GRID || $GRID == -h || $GRID == --help ]] && usage 0
shift
LAUNCHER=slurm
DRY_RUN=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --launcher) LAUNCHER=${2:?--launcher needs slurm, sbatch or local}; shift 2 ;;
    --launcher=*) LAUNCHER=${1#--launcher=}; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

ARCH=${ARCH:-gpt2}
SEEDS=${SEEDS:-0}
PYTHON=${PYTHON:-python}
GROUP=${GROUP:-paper-${GRID}-${ARCH}}

# --- the grids: swept keys (comma lists) and fixed keys ----------------------------------------
ATTENTIONS=exp,linear,window,power
# Commas are Hydra's sweep syntax (one job per value), hence quoted words.
case $GRID in
  main)    SWEEP=("attention=$ATTENTIONS" "ctx=1024,8192,65536" "model=small,medium,large")
           FIXED=(p=2) ;;
  ctx)     SWEEP=("attention=$ATTENTIONS" "ctx=1024,2048,4096,8192,16384,32768,65536")
           FIXED=(p=2 model=small) ;;
  reshape) SWEEP=("ctx=1024,8192,65536")
           FIXED=(attention=power p=2 model=small data.reshape_block=1024) ;;
  smoke)   SWEEP=("attention=$ATTENTIONS" "ctx=128,256")
           FIXED=(p=2 model=tiny trainer.max_steps=200 trainer.eval_every=100)
           WINDOW=${WINDOW:-64} ;;   # below its contexts: the config's 1024 would make the window arm softmax
  *) echo "sweep_paper.sh: unknown grid '$GRID' (main, ctx, reshape, smoke)" >&2; usage 2 ;;
esac
SWEEP+=("seed=$SEEDS")
FIXED=("arch=$ARCH" "${FIXED[@]}")
[[ -n ${WINDOW:-} ]] && FIXED+=("window=$WINDOW")
if [[ $GRID != smoke ]]; then
  if [[ -z ${DATA_PATH:-} ]]; then
    if [[ $DRY_RUN -eq 1 ]]; then DATA_PATH='<DATA_PATH>'
    else echo "sweep_paper.sh: set DATA_PATH to the LongCrawl64 folder (holding train.zarr, heldout.zarr)" >&2; exit 2; fi
  fi
  # The paper's recipe (conf/experiment/paper.yaml: LongCrawl64, lr 3e-4, warmup 2000, cosine to 1e-5,
  # bf16, compiled blocks); the grid's own ctx/model/attention overrides still win.
  FIXED+=(experiment=paper "data.path=$DATA_PATH")
fi
FIXED+=("logger.wandb.group=$GROUP")
# An extra override of a key the grid sweeps would make every point the same run; for sbatch (one plain train.py
# per point) a comma value would be a sweep inside each job: both refused before anything is submitted.
swept_keys=" ${SWEEP[*]%%=*} "
for item in "${EXTRA[@]}"; do
  key=${item%%=*}; key=${key#[+~]}; key=${key#+}
  if [[ $swept_keys == *" $key "* ]]; then
    hint="every point would get this one value"; [[ $key == seed ]] && hint="SEEDS=0,1 sets the grid's seeds"
    echo "sweep_paper.sh: $item: the $GRID grid sweeps $key ($hint)" >&2; exit 2
  fi
  if [[ $LAUNCHER == sbatch && ${item#*=} == *,* && $item != *[\[\(\{\'\"]* ]]; then
    echo "sweep_paper.sh: $item: several values are a sweep, and --launcher sbatch submits one plain run per point" \
         "(SEEDS=0,1 for seeds; other axes: one sweep_paper.sh call per value)" >&2; exit 2
  fi
done

run() {  # print the command (shell-quoted), then run it unless --dry-run
  printf '%q ' "$@"; echo
  [[ $DRY_RUN -eq 1 ]] || "$@"
}

case $LAUNCHER in
  slurm)
    if [[ ${GPUS_PER_NODE:-1} -gt 1 ]]; then
      echo "sweep_paper.sh: the submitit launcher runs one process per job; for several GPUs per grid point" \
           "use --launcher sbatch with SBATCH_ARGS=\"--gpus-per-node=$GPUS_PER_NODE ...\"" >&2
      exit 2
    fi
    LAUNCH=(hydra/launcher=submitit_slurm
            "hydra.launcher.timeout_min=${TIMEOUT_MIN:-4320}"
            "hydra.launcher.cpus_per_task=${CPUS_PER_TASK:-8}"
            hydra.launcher.tasks_per_node=1
            "hydra.launcher.name=$GROUP")
    # GPUS_PER_NODE=0: CPU-only jobs (no gres request), e.g. the smoke grid on a CPU partition.
    [[ ${GPUS_PER_NODE:-1} -gt 0 ]] && LAUNCH+=("hydra.launcher.gpus_per_node=${GPUS_PER_NODE:-1}")
    [[ -n ${PARTITION:-} ]] && LAUNCH+=("hydra.launcher.partition=$PARTITION")
    [[ -n ${ACCOUNT:-} ]] && LAUNCH+=("hydra.launcher.account=$ACCOUNT")
    [[ -n ${QOS:-} ]] && LAUNCH+=("hydra.launcher.qos=$QOS")
    [[ -n ${CONSTRAINT:-} ]] && LAUNCH+=("hydra.launcher.constraint=$CONSTRAINT")
    [[ -n ${MEM_GB:-} ]] && LAUNCH+=("hydra.launcher.mem_gb=$MEM_GB")
    [[ -n ${ARRAY_PARALLELISM:-} ]] && LAUNCH+=("hydra.launcher.array_parallelism=$ARRAY_PARALLELISM")
    run "$PYTHON" train.py -m "${LAUNCH[@]}" "hydra.sweep.dir=multirun/$GROUP/\${now:%Y-%m-%d_%H-%M-%S}" \
        "${FIXED[@]}" "${SWEEP[@]}" "${EXTRA[@]}"
    ;;
  local)
    run "$PYTHON" train.py -m "hydra.sweep.dir=multirun/$GROUP/\${now:%Y-%m-%d_%H-%M-%S}" \
        "${FIXED[@]}" "${SWEEP[@]}" "${EXTRA[@]}"
    ;;
  sbatch)
    # Expand the cartesian product of the comma lists here; each point is one DDP job whose run
    # directory is runs/<group>/<run_name>: deterministic, so a requeued or resubmitted job resumes
    # its own run (sbatch_ddp.sh passes trainer.resume=auto), and unique across grids.
    points=("")
    for kv in "${SWEEP[@]}"; do
      key=${kv%%=*}; IFS=, read -r -a vals <<<"${kv#*=}"
      next=()
      for pt in "${points[@]}"; do for v in "${vals[@]}"; do next+=("$pt $key=$v"); done; done
      points=("${next[@]}")
    done
    read -r -a sbatch_args <<<"${SBATCH_ARGS:-}"
    for pt in "${points[@]}"; do
      read -r -a pt_args <<<"$pt"
      # train.py refuses a key its point's attention does not read (p for exp, window for power): each point
      # gets p and WINDOW only where its attention reads them, as a multirun's jobs compose them unread
      chosen=" ${FIXED[*]} ${pt_args[*]} "
      pt_fixed=()
      for f in "${FIXED[@]}"; do
        case $f in
          p=*) [[ $chosen == *" attention=power "* ]] || continue ;;
          window=*) [[ $chosen == *" attention=window "* ]] || continue ;;
        esac
        pt_fixed+=("$f")
      done
      run sbatch --job-name="$GROUP" "${sbatch_args[@]}" scripts/slurm/sbatch_ddp.sh \
          "hydra.run.dir=runs/$GROUP/\${run_name}" "${pt_fixed[@]}" "${pt_args[@]}" "${EXTRA[@]}"
    done
    ;;
  *) echo "sweep_paper.sh: unknown launcher '$LAUNCHER' (slurm, sbatch, local)" >&2; exit 2 ;;
esac
