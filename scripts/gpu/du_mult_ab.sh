#!/usr/bin/env bash
# Branch exp/du-mult on a GPU: dU written with the key side's multiplicities by the query side's scan (DU_MULT), the
# Gluon key kernels then skip them. GPU test modes, then 64k profiles with and without it (one process each).
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/du_mult_ab.sh     (writes under $OUT)
OUT=${OUT:-runs/du_mult}
python3 -m pytest -q -p no:cacheprovider -n 10 tests/kernels/test_power_gpu.py \
  -k "dumult or scan or gluonk or gluonv or state or pieces or (chunked and not 64k)" 2>&1 | tail -4
profile() {   # NAME [--set ...] [--no-check]
  local name=$1; shift
  echo "== $name $*"
  python3 scripts/tune_sym2.py --out "$OUT/$name" --sweep qbwd_rows --configs 1,64,4,1,168 "$@" 2>&1 \
    | grep -E "^CHECK bf16:|^PROFILE|^TIME"
}
profile du_mult
profile plain --no-check --set DU_MULT=0
profile du_mult_kdk168 --no-check --set GLUON_KDK_REGS=168
