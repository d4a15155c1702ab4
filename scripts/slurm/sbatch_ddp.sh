#!/usr/bin/env bash
# Multi-node DDP training job: one `torchrun` per node (srun), rendezvous from the Slurm allocation.
#
#   sbatch [sbatch options] scripts/slurm/sbatch_ddp.sh [hydra overrides for train.py ...]
#
# Submit from the repository root (the job runs train.py from $SLURM_SUBMIT_DIR). Examples:
#   # 4 nodes x 8 GPUs, GPT-2 small with power attention at 64k context (NCCL):
#   sbatch --nodes=4 --gpus-per-node=8 --cpus-per-task=64 --time=2-00:00:00 \
#       scripts/slurm/sbatch_ddp.sh attention=power p=2 ctx=65536 model=small \
#       data=longcrawl64 data.path=/data/longcrawl64 logger.wandb.group=lc64-power
#   # 1 node, 1 process on CPU (gloo), the tiny default run:
#   sbatch --nodes=1 --cpus-per-task=2 scripts/slurm/sbatch_ddp.sh trainer.max_steps=20 optim.warmup_steps=5
#
# Processes per node: $NPROC_PER_NODE if set, else the GPUs Slurm gave the job on this node
# ($SLURM_GPUS_ON_NODE), else the visible GPUs (nvidia-smi), else 1 (CPU). The trainer picks the
# backend itself: NCCL when CUDA is available, gloo on CPU.
# Python: $LONGCTX_PYTHON if set, else `python` on the PATH the job inherited from `sbatch`.
# Preemption/timeout: Slurm sends SIGUSR1 180 s before the end; the job requeues itself and, since
# every launch passes trainer.resume=auto first (a later trainer.resume=... on the command line wins),
# the requeued job continues from the run directory's newest checkpoint.
#SBATCH --job-name=longctx-ddp
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --signal=B:USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

if [[ -z ${SLURM_JOB_ID:-} ]]; then
  echo "sbatch_ddp.sh: submit with sbatch (it reads the Slurm allocation): sbatch $0 [overrides]" >&2
  exit 2
fi

REPO=${SLURM_SUBMIT_DIR:?}
cd "$REPO"
[[ -f train.py ]] || { echo "sbatch_ddp.sh: no train.py in $REPO: submit from the repository root" >&2; exit 2; }
PYTHON=${LONGCTX_PYTHON:-python}

# --- processes per node -----------------------------------------------------------------------------
gpus_here() {
  if [[ -n ${SLURM_GPUS_ON_NODE:-} ]]; then echo "$SLURM_GPUS_ON_NODE"; return; fi
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES"; return; fi
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; return; fi
  echo 0
}
NPROC=${NPROC_PER_NODE:-$(gpus_here)}
[[ $NPROC =~ ^[0-9]+$ && $NPROC -ge 1 ]] || NPROC=1
NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}

# --- rendezvous: the first node of the allocation hosts the c10d store ----------------------------
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export MASTER_ADDR MASTER_PORT
# CPU threads per process (torchrun would otherwise force 1 when NPROC > 1).
if [[ -n ${SLURM_CPUS_PER_TASK:-} && -z ${OMP_NUM_THREADS:-} ]]; then
  export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / NPROC > 0 ? SLURM_CPUS_PER_TASK / NPROC : 1 ))
fi

echo "[sbatch_ddp] job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): $NNODES node(s) x $NPROC proc," \
     "rendezvous $MASTER_ADDR:$MASTER_PORT, nodes $SLURM_JOB_NODELIST, python $(command -v "$PYTHON")"
echo "[sbatch_ddp] overrides: trainer.resume=auto $*"

# --- requeue on SIGUSR1 (time limit / preemption warning) -----------------------------------------
requeue() {
  echo "[sbatch_ddp] SIGUSR1: requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
}
trap requeue USR1

SRUN_ARGS=(--nodes="$NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1)
# Slurm 22.05 steps no longer inherit --cpus-per-task from the job: pass it on, or torchrun and all
# its workers would be confined to one CPU where task/affinity or task/cgroup binds.
[[ -n ${SLURM_CPUS_PER_TASK:-} ]] && SRUN_ARGS+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")

# srun in the background + wait, so the USR1 trap runs while training does.
srun "${SRUN_ARGS[@]}" "$PYTHON" -m torch.distributed.run \
  --nnodes="$NNODES" --nproc-per-node="$NPROC" \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
  --max-restarts=0 \
  train.py trainer.resume=auto "$@" &
SRUN_PID=$!
status=0
wait "$SRUN_PID" || status=$?
# A trapped signal interrupts `wait`: wait again for srun itself to finish.
while kill -0 "$SRUN_PID" 2>/dev/null; do wait "$SRUN_PID" || status=$?; done
echo "[sbatch_ddp] srun exited with status $status"
exit "$status"
