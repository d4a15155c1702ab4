#!/usr/bin/env bash
# The chunked form's intra-chunk attention backward at 64k (chunk 1024: short sequences, many of them) under other
# tiles and register caps than the attention form's defaults (triton_attention._blocks, swept at 4k-8k): one
# tune_sym2.py process per dk/dv config, kernel profile per run. dk/dv runs at 255 registers, 2 programs per SM
# (ncu, session 16). ~4 minutes on a warm H100.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/attn_blocks_64k.sh     (writes under $OUT)
OUT=${OUT:-runs/attn_blocks}
for cfg in default 64,64,4,3,168 64,64,4,2,168 64,64,4,2,128 32,64,4,3 32,64,4,2,128 128,64,8,2 64,128,8,2; do
  extra=()
  [ "$cfg" = default ] || extra=(--attn-blocks "dkdv=$cfg")
  echo "== dkdv $cfg"
  timeout 120 python3 scripts/tune_sym2.py --out "$OUT/dkdv_${cfg//,/_}" --no-check --sweep qbwd_rows \
    --configs 1,64,4,1,168 "${extra[@]}" 2>&1 | grep -E "^PROFILE|^TIME|Error"
done
