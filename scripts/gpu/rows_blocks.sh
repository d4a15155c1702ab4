#!/usr/bin/env bash
# Blocks of the Gluon row kernels beyond their defaults (64 rows, 4 warps, a 4-slot cp.async ring), fwd+bwd wall time
# in one process with each variant's outputs checked against the default's (ab_switch.py). Session 20 (H100):
#  - query backward / key dk at 128 rows on 8 warps (two warpgroups share each state slice, half the L2 reads;
#    uncapped, 1 program per SM): 64k profiles 10.22 / 10.00 ms against 9.43 / 9.38, fwd+bwd 58.54 -> 59.64;
#  - 8-slot rings (Triton 3.6, d=64: key dk 64 -> 8 bytes of stack, key dv 32 -> 0, at 73-90 KB of shared memory):
#    this script. (2 slots is not a valid ring for these kernels: gluon_rows._grad_pass asserts 3 or more.)
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/rows_blocks.sh        (writes under $OUT)
OUT=${OUT:-runs/rows_blocks}
timeout 300 python3 scripts/gpu/ab_switch.py --ctxs 65536,8192 --rounds 2 --out "$OUT/ab" --variants default \
  GLUON_KDK_BLOCK=64,4,8 GLUON_KDV_BLOCK=64,4,8 GLUON_KDK_BLOCK=64,4,8+GLUON_KDV_BLOCK=64,4,8 \
  GLUON_QBWD_BLOCK=64,4,8 2>&1 | grep -E "^t=|Error"
