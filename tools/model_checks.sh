#!/usr/bin/env bash
# GPU run for the model zoo: GPU tests, then 50-step training at 64k for GPT-2 and RWKV7 small
# with power p=2, then the training benchmark. Logs land in $OUT (or ./gpu_out).
#   bash tools/model_checks.sh [tests] [train] [bench]
source tools/setup_device.sh
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
stages=${*:-tests train bench}
for stage in $stages; do
  case $stage in
    tests) python3 -m pytest tests/models tests/kernels -m gpu -q -x 2>&1 | tee "$OUT/gpu_tests.log" | tail -25 ;;
    train)
      for arch in gpt2 rwkv7; do
        timeout 400 python3 train.py arch=$arch attention=power p=2 ctx=65536 model=small trainer.max_steps=50 \
          trainer.eval_every=25 data.docs_per_batch=8 trainer.micro_docs=1 data.n_heldout=8 data.eval_docs=8 \
          trainer.activation_checkpointing=true logger.wandb.mode=disabled cache_dir=/tmp/lcache \
          hydra.run.dir=/tmp/runs/$arch 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tee "$OUT/train_$arch.log" | tail -8
        cp /tmp/runs/$arch/metrics.jsonl "$OUT/metrics_$arch.jsonl" 2>/dev/null
      done ;;
    bench) timeout 500 python3 scripts/bench_train.py --out "$OUT" 2>&1 | tee "$OUT/bench_train.log" | tail -40 ;;
  esac
done
