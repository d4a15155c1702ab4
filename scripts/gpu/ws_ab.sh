#!/usr/bin/env bash
# First device run of the warp-specialized Gluon query forward / key dv (triton_sym2.GLUON_WS, prepared in session 19,
# built for sm_90 but never run): the GPU test modes against the cp.async kernels, tune_sym2.py's float64 check and
# 64k kernel profiles at three register caps, then fwd+bwd wall time against the default in one process. ~5 minutes
# on a warm H100. Session 20 (H100): correct, not faster (query forward / key dv 5.68 / 5.05 ms against 5.37 / 4.62;
# fwd+bwd 64k 60.12 -> 59.98, forward 16.48 -> 17.04), so GLUON_WS stays off.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/ws_ab.sh        (writes under $OUT)
OUT=${OUT:-runs/ws_ab}
timeout 150 python3 -m pytest -n 2 tests/kernels/test_power_gpu.py -q -p no:cacheprovider -k "ws-bf16 or gluonf or gluonv" \
  2>&1 | tail -3
for v in "GLUON_WS=0" "GLUON_WS=1 GLUON_WS_REGS=80" "GLUON_WS=1 GLUON_WS_REGS=64" "GLUON_WS=1 GLUON_WS_REGS=96"; do
  echo "== $v"
  timeout 120 python3 scripts/tune_sym2.py --out "$OUT/${v// /_}" --sweep qbwd_rows --configs 1,64,4,1,168 \
    --set $v 2>&1 | grep -E "^PROFILE|^CHECK bf16:|Error"
done
timeout 150 python3 scripts/gpu/ab_switch.py --variants GLUON_WS=0 GLUON_WS=1 --ctxs 65536,8192 --rounds 3 --fwd \
  --out "$OUT/ab"
