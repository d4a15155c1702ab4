#!/usr/bin/env bash
# GPU run for the model zoo, one stage per call where time is short (each fits 10 minutes on one H100/H200):
#   kernels the power-attention kernel GPU tests (four xdist workers a GPU; each result in the log as it lands, -v)
#   tests  the model GPU tests (xdist over every GPU; FLA autotunes on first use: carry an autotune cache, docs/gpu.md)
#   train  50 steps at 64k of GPT-2 and RWKV7 small with power p=2 through train.py
#   paths  scripts/compare_train_paths.py: 200 steps of the recipe's path vs the eager path vs another seed
#   bench  scripts/bench_train.py: every arch x row in one process, the recipe and the eager path
#   decode the decoding GPU tests alone (every arch x attention, fused kernel, graphs), each result in the log as it
#          lands (-v), so a cut call keeps what finished
#   decode-bench  scripts/bench_decode.py, every model, path and batch in one run (README's decoding table)
#   kernel-bench  scripts/bench_attention.py, longctx beside cuDNN and retention 1.0.7 (README's kernel table; carry
#          retention's wheel in .whl/, docs/gpu.md); bench.json and bench.png under $OUT/bench_attention
# Logs and results land in $OUT (or ./gpu_out); the autotune winners are kept for the next machine.
#   bash tools/model_checks.sh [kernels] [tests] [train] [paths] [bench] [decode] [decode-bench] [kernel-bench]
# One after another these cost more than a call's 10 minutes: run the tests stages alone, and never serially
# (`pytest -m gpu tests/kernels` on one process runs past 7 minutes on an H100).
# A stage stops after STAGE_S seconds (default 580, the tests 560): give less where the call has less left, so that
# the autotune winners and what finished are still kept (STAGE_S=300 bash tools/model_checks.sh kernel-bench).
stages=${*:-tests train paths bench}
stage_s=${STAGE_S:-580}
case $stage_s in   # a bad limit is refused before anything runs, as a misspelt stage is
  ''|*[!0-9]*) echo "model_checks.sh: STAGE_S='$stage_s' is not a whole number of seconds" >&2; exit 2 ;;
esac
if [ "$stage_s" -lt 60 ]; then echo "model_checks.sh: STAGE_S=$stage_s is under 60 seconds" >&2; exit 2; fi
for stage in $stages; do   # a misspelt stage is refused before anything is installed or run
  case $stage in kernels|tests|train|paths|bench|decode|decode-bench|kernel-bench) ;;
    *) echo "model_checks.sh: unknown stage '$stage' (kernels, tests, train, paths, bench, decode, decode-bench," \
            "kernel-bench)" >&2
       exit 2 ;;
  esac
done
source tools/setup_device.sh
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
n=$(nvidia-smi -L | wc -l)   # GPUs: the test stages spread their xdist workers over them
gpu_tests() {  # $1: log under $OUT, $2: xdist workers, $3: the lines shown here, then the test paths; every result
  local log=$1 workers=$2 shown=$3; shift 3   # in the log by name (-v), so a call cut by its limit keeps what finished
  LONGCTX_TEST_GPUS=$n timeout $((stage_s - 20)) python3 -m pytest -n "$workers" -v -o addopts="" -p no:cacheprovider "$@" \
    -m gpu --durations=15 2>&1 | tee "$OUT/$log" | grep -E "$shown" | tail -70
}
summary="FAILED|ERROR|passed|failed|slowest|^[0-9.]+s "
for stage in $stages; do
  case $stage in
    kernels) gpu_tests kernel_tests.log $((4 * n)) "$summary" tests/kernels ;;
    tests) # two xdist workers per GPU, spread over every visible GPU (tests/conftest.py); ~5.5 min on 3 H200s
      gpu_tests gpu_tests.log $((n > 1 ? 2 * n : 4)) "$summary" tests/models tests/train tests/eval ;;
    train)
      for arch in gpt2 rwkv7; do
        timeout 400 python3 train.py experiment=paper arch=$arch attention=power p=2 data=icl_markov \
          data.doc_len=65536 data.train_tokens=33554432 trainer.max_steps=50 trainer.eval_every=25 \
          data.docs_per_batch=8 data.n_heldout=8 data.eval_docs=8 logger.wandb.mode=disabled \
          cache_dir=/tmp/lcache hydra.run.dir=/tmp/runs/$arch 2>&1 | tee "$OUT/train_$arch.log" | tail -8
        cp /tmp/runs/$arch/metrics.jsonl "$OUT/metrics_$arch.jsonl" 2>/dev/null
      done ;;
    decode) # three xdist workers on each GPU: the cases compile on the CPU side by side (correctness, not timing)
      gpu_tests decode_tests.log $((3 * n)) "PASSED|$summary" tests/models/test_decoding_gpu.py ;;
    decode-bench) # README's decoding table: every model, path and batch in one run
      timeout $stage_s python3 scripts/bench_decode.py --out "$OUT/bench_decode" --budget-s 500 \
        --paths compiled-model+fused,compiled+fused,compiled-model,compiled,static,eager --profile \
        > "$OUT/bench_decode.log" 2>&1
      grep -E '^\{|^  |wrote' "$OUT/bench_decode.log" | cut -c1-260 | tail -90 ;;
    kernel-bench) # one process, every context of the README's table (retention autotunes on first use: minutes)
      timeout $stage_s python3 scripts/bench_attention.py --out "$OUT/bench_attention" --ctxs 1024,4096,8192,16384,65536 \
        --skip sdpa_flash,longctx_p2_attention,power_attention_1.4.4_p2 > "$OUT/bench_attention.log" 2>&1
      grep -A40 '^TABLE' "$OUT/bench_attention.log" | tail -40 ;;
    paths) timeout $stage_s python3 scripts/compare_train_paths.py --out "$OUT" 2>&1 | tee "$OUT/paths.log" | tail -12 ;;
    bench) timeout $stage_s python3 scripts/bench_train.py --out "$OUT" --variant recipe= \
             --variant before="trainer.compile=false trainer.activation_checkpointing=true" 2>&1 \
             | tee "$OUT/bench_train.log" | tail -40 ;;
  esac
done
bash tools/keep_autotune.sh
