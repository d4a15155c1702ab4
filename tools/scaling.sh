#!/usr/bin/env bash
# GPU run (2-GPU machine): DDP strong scaling of GPT-2 small, power p=2, ctx 65536 on 1 and 2 GPUs at the
# same global batch, then 50-step 64k training runs of GPT-2 and RWKV7, each stage
# bounded in time. Logs and metrics land in $OUT.
#   bash tools/scaling.sh [tests] [scaling] [train]
source tools/setup_device.sh
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
COMMON=(attention=power p=2 ctx=65536 model=small data.n_heldout=2 data.eval_docs=2 trainer.micro_docs=1
        trainer.activation_checkpointing=true logger.wandb.mode=disabled cache_dir=/tmp/lcache)
clean() { tr '\r' '\n' | grep -v "it/s" ; }
for stage in ${*:-tests scaling train}; do
  case $stage in
    tests) timeout 150 python3 -m pytest tests/models -m gpu -q -x 2>&1 | tee "$OUT/gpu_model_tests.log" | tail -15 ;;
    scaling)
      for n in 1 2; do
        timeout 200 python3 -m torch.distributed.run --standalone --nproc_per_node=$n train.py "${COMMON[@]}" \
          data.docs_per_batch=4 trainer.max_steps=8 trainer.eval_every=4 hydra.run.dir=/tmp/runs/scale$n \
          2>&1 | clean | tee "$OUT/scale$n.log" | tail -4
        cp /tmp/runs/scale$n/metrics.jsonl "$OUT/metrics_scale$n.jsonl"
      done
      python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rate = {n: json.loads(open(f"{out}/metrics_scale{n}.jsonl").read().splitlines()[-1])["tokens_per_s"] for n in (1, 2)}
print(f"SCALING tokens/s 1 GPU {rate[1]:.0f}, 2 GPUs {rate[2]:.0f}, ratio {rate[2] / rate[1]:.2f}")
PY
      ;;
    train)
      for arch in gpt2 rwkv7; do
        timeout 170 python3 train.py arch=$arch "${COMMON[@]}" data.docs_per_batch=1 trainer.max_steps=50 \
          trainer.eval_every=25 hydra.run.dir=/tmp/runs/$arch 2>&1 | clean | tee "$OUT/train_$arch.log" | tail -5
        cp /tmp/runs/$arch/metrics.jsonl "$OUT/metrics_$arch.jsonl" 2>/dev/null
      done ;;
  esac
done
