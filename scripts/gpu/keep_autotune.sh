#!/usr/bin/env bash
# Run at the end of a device command: copies the Triton autotune winners of this machine (small JSON files, one
# folder per cache key) to $OUT/autotune_cache. Put that folder back as .autotune_cache/ in the repo (git-ignored)
# and carry it: scripts/gpu/setup_device.sh seeds the next machine's Triton cache with it.
#   bash scripts/gpu/keep_autotune.sh
tc="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
dest="${OUT:?set OUT}/autotune_cache"
mkdir -p "$dest"
if [ -d "$tc" ]; then
  (cd "$tc" && find . -name '*.autotune.json' -print0 | xargs -0 -r cp --parents -t "$dest/") || true
fi
echo "kept $(find "$dest" -name '*.autotune.json' | wc -l) autotune results in $dest"
