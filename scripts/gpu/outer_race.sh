#!/usr/bin/env bash
# Tests session 19's suspect for the Gluon outer products' normalizer race (one block per feature group: d=64 at
# (JG, rows) = (1, 64), d=128 at (1, 16)): the next step's operands written into the registers the previous step's
# in-flight normalizer matmuls read. GLUON_OUTER_DRAIN waits for those matmuls first. If the race is that, the
# float64 check's z error stops moving between runs with it (1.8e-3 at (2, 32); 1.8e-3..5.4e-3 at (1, 64) without),
# and d=128's per-chunk normalizer rows match. Also times what the drain costs. ~2.5 minutes on a warm H100.
# Session 20 (H100): it held; d=128 had rows off in 3 of 12 slots without the drain and none with it, so the drain is
# on by default (triton_sym2.GLUON_OUTER_DRAIN) and the GLUON_OUTER_DRAIN=0 rows below show the race.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/outer_race.sh        (writes under $OUT)
OUT=${OUT:-runs/outer_race}
for v in "GLUON_OUTER_ROWS64=1 GLUON_OUTER_DRAIN=0" "GLUON_OUTER_ROWS64=1 GLUON_OUTER_DRAIN=1" \
         "GLUON_OUTER_ROWS64=1 GLUON_OUTER_DRAIN=0" "GLUON_OUTER_ROWS64=1 GLUON_OUTER_DRAIN=1" \
         "GLUON_OUTER_ROWS64=0 GLUON_OUTER_DRAIN=1" "GLUON_OUTER_ROWS64=0 GLUON_OUTER_DRAIN=0"; do
  echo "== $v"
  timeout 120 python3 scripts/tune_sym2.py --out "$OUT/${v// /_}" --sweep qbwd_rows --configs 1,64,4,1,168 \
    --set $v 2>&1 | grep -E "^PROFILE|^CHECK bf16|Error"
done
for flag in "--no-drain" ""; do
  echo "== check_outer.py --d 128 $flag"
  timeout 90 python3 scripts/gpu/check_outer.py --d 128 $flag 2>&1 | tail -12
done
