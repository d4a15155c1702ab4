#!/usr/bin/env bash
# Which hardware roof each kernel of one p=2 chunked fwd+bwd sits under (b=8, h=12, d=64, bf16, gated, chunk 1024,
# t = $1, default 16384): per kernel, the tensor pipe's busy share (wgmma), shared memory's bank reads / writes and
# LSU wavefronts, issue slots, L2 and DRAM throughput, each as % of its peak (ncu raw metrics), as CSV under $OUT and
# one summary line per kernel. The question it answers: is a state kernel's ~45% of the matmul rate a shared-memory
# roof (every wgmma reads its B operand from shared memory, 1/32 byte per MAC at any N) or latency.
#   source tools/setup_device.sh; bash tools/ncu_pipes.sh 16384
T=${1:-16384}
OUT=${OUT:-runs/ncu_pipes}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
METRICS="regex:^(sm__pipe_tensor_op_(gmma|hmma)_cycles_active\.avg\.pct_of_peak_sustained_active"
METRICS+="|sm__inst_executed_pipe_tensor_op_gmma\.sum"
METRICS+="|l1tex__data_bank_(reads|writes)\.avg\.pct_of_peak_sustained_elapsed"
METRICS+="|l1tex__data_pipe_lsu_wavefronts_mem_shared\.avg\.pct_of_peak_sustained_elapsed"
METRICS+="|l1tex__throughput\.avg\.pct_of_peak_sustained_active"
METRICS+="|smsp__issue_active\.avg\.pct_of_peak_sustained_active"
METRICS+="|smsp__inst_executed_pipe_fma\.avg\.pct_of_peak_sustained_active"
METRICS+="|smsp__pipe_fma_cycles_active\.avg\.pct_of_peak_sustained_active"
METRICS+="|lts__throughput\.avg\.pct_of_peak_sustained_elapsed"
METRICS+="|dram__throughput\.avg\.pct_of_peak_sustained_elapsed"
METRICS+="|sm__warps_active\.avg\.pct_of_peak_sustained_active"
METRICS+="|gpu__time_duration\.sum)$"
"$NCU" --clock-control none --kernel-name regex:"gluon_|_attn_" --metrics "$METRICS" --csv \
  python3 -m tools.ncu_call --t "$T" --one-stream > "$OUT/ncu_pipes_${T}.csv" 2> "$OUT/ncu_pipes_${T}.err"
echo "ncu rc=$? rows=$(wc -l < "$OUT/ncu_pipes_${T}.csv")"
python3 - "$OUT/ncu_pipes_${T}.csv" <<'PY'
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
ix = {k: i for i, k in enumerate(rows[0])}
short = {"gpu__time_duration.sum": "us", "sm__inst_executed_pipe_tensor_op_gmma.sum": "gmma_inst"}
per = collections.OrderedDict()
for r in rows[1:]:
    key = f'{r[ix["ID"]]:>3} {r[ix["Kernel Name"]][:24]}'
    name = r[ix["Metric Name"]]
    unit, rest = name.split("__", 1)
    label = short.get(name, (unit + ":" if rest.startswith("throughput") else "") + rest.split(".")[0])
    value = r[ix["Metric Value"]].replace(",", "")
    try:
        value = float(value)
        if name == "gpu__time_duration.sum":
            value /= 1e3 if r[ix["Metric Unit"]] in ("ns", "nsecond") else 1
    except ValueError:
        pass
    per.setdefault(key, {})[label] = value
labels = sorted({k for m in per.values() for k in m})
print("kernel".ljust(28), " ".join(lab[:14].rjust(14) for lab in labels))
for key, m in per.items():
    print(key.ljust(28), " ".join((f"{m[lab]:14.1f}" if isinstance(m.get(lab), float) else str(m.get(lab, "-")).rjust(14))
                                  for lab in labels))
PY
