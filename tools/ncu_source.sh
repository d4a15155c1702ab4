#!/usr/bin/env bash
# Warp-state sampling per SASS instruction of the Gluon row kernels and the outer products (one p=2 chunked fwd+bwd,
# b=8, h=12, d=64, bf16, gated, chunk 1024, t = $1, default 16384), one report per kernel, summarized by
# ncu_source_top.py: which instruction the warps wait at (the wgmma wait, the operand loads, the spill reloads, the
# slice copy). ~3 minutes on a warm H100.
#   source tools/setup_device.sh; bash tools/ncu_source.sh 16384        (writes under $OUT)
T=${1:-16384}
OUT=${OUT:-runs/ncu_source}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
"$NCU" --version | tail -1
for k in gluon_query_fwd_rows gluon_key_dv_rows gluon_query_bwd_rows gluon_key_dk_rows gluon_outer; do
  timeout 150 "$NCU" --clock-control none --kernel-name "regex:^${k}\$" --launch-count 1 --section SourceCounters \
    --section WarpStateStats \
    -f -o "$OUT/$k" python3 -m tools.ncu_call --t "$T" --one-stream > "$OUT/$k.log" 2>&1
  echo "$k: ncu rc=$?"
  "$NCU" --import "$OUT/$k.ncu-rep" --page source --csv --print-source sass > "$OUT/$k.csv" 2> "$OUT/$k.err" \
    && python3 -m tools.ncu_source_top "$OUT/$k.csv" --top 25 || tail -3 "$OUT/$k.err"
done
