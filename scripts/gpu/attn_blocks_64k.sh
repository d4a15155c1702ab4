#!/usr/bin/env bash
# The chunked form's intra-chunk attention kernels at 64k (chunk 1024: short sequences, many of them) under other
# tiles and register caps than the defaults (triton_attention._blocks, swept at 4k-8k for the attention form): one
# tune_sym2.py process per config, kernel profile per run. KERNEL: dkdv (default; session 17: the default 5.93 ms
# won), fwd (128, 32, 4, 3, 168; it now also writes the keys' scaled copy) or dq (64, 64, 4, 1, 128; it also writes
# the queries' copy). ~4 minutes per kernel on a warm H100.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/attn_blocks_64k.sh [dkdv|fwd|dq] [CFG ...]   (under $OUT)
# CFG: BM,BN,warps,stages[,maxnreg] or "default"; without them the kernel's list below.
OUT=${OUT:-runs/attn_blocks}
KERNEL=${1:-dkdv}
case "$KERNEL" in
  dkdv) cfgs="default 64,64,4,3,168 64,64,4,2,168 64,64,4,2,128 32,64,4,3 32,64,4,2,128 128,64,8,2 64,128,8,2" ;;
  fwd) cfgs="default 128,64,4,3,168 128,64,8,3 128,32,8,3 64,64,4,3,128 128,128,8,2 64,32,4,3,128" ;;
  dq) cfgs="default 64,64,4,2,128 64,64,4,3,168 128,64,8,2 64,32,4,2,128 128,32,8,3" ;;
  *) echo "KERNEL must be dkdv, fwd or dq, got '$KERNEL'" >&2; exit 2 ;;
esac
[ $# -gt 1 ] && cfgs="${*:2}"
for cfg in $cfgs; do
  extra=()
  [ "$cfg" = default ] || extra=(--attn-blocks "$KERNEL=$cfg")
  echo "== $KERNEL $cfg"
  timeout 120 python3 scripts/tune_sym2.py --out "$OUT/${KERNEL}_${cfg//,/_}" --no-check --sweep qbwd_rows \
    --configs 1,64,4,1,168 "${extra[@]}" 2>&1 | grep -E "^PROFILE|^TIME|Error"
done
