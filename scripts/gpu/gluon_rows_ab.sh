#!/usr/bin/env bash
# The Gluon row kernels (src/kernels/power/gluon_rows.py) on a GPU: their GPU test modes, then 64k profiles
# (tune_sym2.py, b=8 h=12 d=64 chunk 1024, one process per variant on the same machine) with each experimental
# switch on against the defaults, block variants, and all on with the float64 check. ~8 minutes on a fresh H100.
#   source scripts/gpu/setup_device.sh; bash scripts/gpu/gluon_rows_ab.sh     (writes under $OUT)
OUT=${OUT:-runs/gluon_rows}
python3 -m pytest -q -p no:cacheprovider -n 10 tests/kernels/test_power_gpu.py \
  -k "gluonq or gluonf or gluonv or gluonk" 2>&1 | tail -4
profile() {   # NAME [--set ...] [--no-check]: one process, the kernel profile and fwd+bwd time
  local name=$1; shift
  echo "== $name $*"
  python3 scripts/tune_sym2.py --out "$OUT/$name" --sweep qbwd_rows --configs 1,64,4,1,168 "$@" 2>&1 \
    | grep -E "^CHECK bf16:|^PROFILE|^TIME"
}
profile defaults --no-check
profile qfwd --no-check --set QFWD_GLUON=1
profile qfwd_128 --no-check --set QFWD_GLUON=1 GLUON_QFWD_BLOCK=128,8,4
profile kdv --no-check --set KDV_GLUON=1
profile kdv_64 --no-check --set KDV_GLUON=1 GLUON_KDV_BLOCK=64,4,4
profile kdk --no-check --set KDK_GLUON=1
profile qbwd_128 --no-check --set GLUON_QBWD_BLOCK=128,8,4
profile all --set QFWD_GLUON=1 KDV_GLUON=1 KDK_GLUON=1
