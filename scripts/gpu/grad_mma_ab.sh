#!/usr/bin/env bash
# The backward-type row kernels' X_i q_i on the tensor cores (triton_sym2.GLUON_QBWD_MMA / GLUON_KDK_MMA, prepared in
# session 21, never run): their GPU test modes, then wall time against the default with every variant's outputs
# checked against it (ab_switch.py), then one kernel profile of the winner. ~6 minutes on a warm H100.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/grad_mma_ab.sh          (writes under $OUT)
OUT=${OUT:-runs/grad_mma}
mkdir -p "$OUT"
timeout 200 python3 -m pytest -n 4 tests/kernels/test_power_gpu.py -q -p no:cacheprovider -k "mma" 2>&1 | tail -3
# the query backward with it does not fit its 168-register cap without spilling more (Triton 3.6: 240 bytes; 232
# registers: none, 2 programs per SM instead of 3)
timeout 250 python3 scripts/gpu/ab_switch.py --out "$OUT" --ctxs 65536,8192 --rounds 3 --variants default \
  GLUON_KDK_MMA=1 GLUON_QBWD_MMA=1 GLUON_QBWD_MMA=1+GLUON_QBWD_REGS=232 2>&1 | grep -E "fwd\+bwd|DISAGREE|Error"
timeout 100 python3 scripts/tune_sym2.py --out "$OUT/prof" --sweep outer --configs 2,64,4,3 --no-check \
  --set GLUON_KDK_MMA=1 2>&1 | grep -E "PROFILE|TIME"
