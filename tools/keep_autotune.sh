#!/usr/bin/env bash
# Run at the end of a device command: packs the Triton autotune winners of this machine (small JSON files, one
# folder per cache key) into $OUT/autotune_cache.tar.gz (one file, easy to carry to the next machine).
# Put it in the repo root as .autotune_cache.tar.gz (git-ignored) and carry it: tools/setup_device.sh seeds
# the next machine's Triton cache with it.
#   bash tools/keep_autotune.sh
tc="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
: "${OUT:?set OUT}"
if [ -d "$tc" ]; then
  (cd "$tc" && find . -name '*.autotune.json' -print0 | tar -czf "$OUT/autotune_cache.tar.gz" --null -T -)
  echo "kept $(tar -tzf "$OUT/autotune_cache.tar.gz" | wc -l) autotune results in $OUT/autotune_cache.tar.gz"
fi
