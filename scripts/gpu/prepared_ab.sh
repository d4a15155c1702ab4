#!/usr/bin/env bash
# Session 21's two prepared (never run) switches, off by default:
#   GLUON_QBWD_MMA / GLUON_KDK_MMA: the backward-type row kernels' X_i q_i on the tensor cores (gluon_rows._grad_pass_mma);
#   GLUON_OUTER_ZC: the normalizer's chunk sums by one more program of the outer products (gluon_sym2._norm_sums_program)
# Their GPU test modes, then wall time against the default with every variant's outputs checked against it
# (ab_switch.py), then one kernel profile with the ones that won switched on (edit --set). ~7 minutes on a warm H100.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/prepared_ab.sh          (writes under $OUT)
OUT=${OUT:-runs/prepared}
mkdir -p "$OUT"
timeout 200 python3 -m pytest -n 4 tests/kernels/test_power_gpu.py -q -p no:cacheprovider -k "mma or zcprog" 2>&1 | tail -3
# the query backward with it does not fit its 168-register cap without spilling more (Triton 3.6: 240 bytes; 232
# registers: none, 2 programs per SM instead of 3)
timeout 300 python3 scripts/gpu/ab_switch.py --out "$OUT" --ctxs 65536,8192 --rounds 3 --variants default \
  GLUON_KDK_MMA=1 GLUON_QBWD_MMA=1 GLUON_QBWD_MMA=1+GLUON_QBWD_REGS=232 GLUON_OUTER_ZC=1 2>&1 \
  | grep -E "fwd\+bwd|DISAGREE|Error"
timeout 100 python3 scripts/tune_sym2.py --out "$OUT/prof" --sweep outer --configs 2,64,4,3 --no-check \
  --set GLUON_KDK_MMA=1 GLUON_OUTER_ZC=1 2>&1 | grep -E "PROFILE|TIME"
