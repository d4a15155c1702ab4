#!/usr/bin/env bash
# Source on an offline GPU machine: installs the wheels carried in .whl/ (see README,
# "On GPUs") into /tmp/site and the package itself, without touching the machine's torch/triton.
#   source tools/setup_device.sh
set -e
if ls .whl/*.whl >/dev/null 2>&1; then
  # once per machine: a second shell sourcing this (a background job) must not reinstall under a running one
  [ "$(cat /tmp/site/.wheels 2>/dev/null)" = "$(ls .whl)" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && ls .whl > /tmp/site/.wheels
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  # vidrial (power-attention 1.4.4's dependency) clones cutlass at import unless this folder exists; its Triton
  # path never uses it
  [ -d /tmp/site/vidrial ] && mkdir -p /tmp/site/vidrial/cutlass/include
fi
python3 -c "import longctx" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
# Triton keeps autotune winners on disk, so a second process on this machine skips FLA's first-call benchmarking
# (~90 s per kernel shape); winners kept by an earlier machine (tools/keep_autotune.sh ->
# .autotune_cache.tar.gz, carried) go into the cache first. Same Triton, FLA and sm_90 only: the cache key hashes
# all three.
export TRITON_CACHE_AUTOTUNING=1
if [ -f .autotune_cache.tar.gz ]; then
  mkdir -p "${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
  tar -xzf .autotune_cache.tar.gz -C "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" --skip-old-files 2>/dev/null || true
fi
python3 -c "import torch, triton, longctx; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
set +e
