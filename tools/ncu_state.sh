#!/usr/bin/env bash
# ncu over one p=2 chunked fwd+bwd (b=8, h=12, d=64, bf16, gated, chunk 1024; t = $1, default 16384): speed of light,
# occupancy, warp state and launch stats of the state and intra-chunk kernels, then (a second pass) each kernel's
# stall reasons per issued instruction, as CSV under $OUT.
#   source tools/setup_device.sh; bash tools/ncu_state.sh 16384
T=${1:-16384}
OUT=${OUT:-runs/ncu}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
"$NCU" --kernel-name regex:"gluon_|_attn_|_transpose" --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --csv \
  python3 -m tools.ncu_call --t "$T" > "$OUT/ncu_${T}.csv" 2> "$OUT/ncu_${T}.err"
echo "ncu rc=$? rows=$(wc -l < "$OUT/ncu_${T}.csv")"
python3 - "$OUT/ncu_${T}.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
head, body = rows[0], rows[1:]
ix = {k: i for i, k in enumerate(head)}
want = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "L1/TEX Cache Throughput",
        "Achieved Active Warps Per SM", "Registers Per Thread", "Warp Cycles Per Issued Instruction",
        "Issue Slots Busy", "Executed Ipc Active")
per = collections.defaultdict(dict)
for r in body:
    name = r[ix["Kernel Name"]][:28]
    metric = r[ix["Metric Name"]]
    if metric in want:
        per[name][metric] = r[ix["Metric Value"]] + " " + r[ix["Metric Unit"]]
for name, m in per.items():
    print(name, " | ".join(f"{k}: {m.get(k, '?')}" for k in want))
PY
# the stall reasons per kernel (cycles a warp spent stalled per issued instruction, by reason: the breakdown behind
# "Warp Cycles Per Issued Instruction"), in a second pass
"$NCU" --kernel-name regex:"gluon_|_attn_" \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv \
  python3 -m tools.ncu_call --t "$T" > "$OUT/ncu_${T}_stalls.csv" 2> "$OUT/ncu_${T}_stalls.err"
echo "ncu stalls rc=$? rows=$(wc -l < "$OUT/ncu_${T}_stalls.csv")"
python3 - "$OUT/ncu_${T}_stalls.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no stall rows")
ix = {k: i for i, k in enumerate(rows[0])}
per = collections.defaultdict(dict)
for r in rows[1:]:
    reason = r[ix["Metric Name"]].replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")
    per[r[ix["Kernel Name"]][:28]][reason] = float(r[ix["Metric Value"]].replace(",", "") or 0)
for name, m in per.items():
    top = sorted(m.items(), key=lambda kv: -kv[1])[:6]
    print(name, " | ".join(f"{k} {v:.2f}" for k, v in top))
PY
