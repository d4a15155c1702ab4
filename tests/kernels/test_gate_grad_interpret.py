"""The gate gradient's bf16 error, on CPU: tools/gate_grad_interpret.py runs the attention form's Triton kernels under
TRITON_INTERPRET=1 (in a subprocess: the interpreter is chosen when triton is imported) with bf16 rounded as on the
GPU, against float64 on the same bf16 inputs."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWITCH = "attention.offdiag_fp32_grads=1"
TWO_KERNELS = "attention.fused_backward=0"


def test_shared_rounding_brings_the_gate_gradient_to_the_input_floor(tmp_path):
    """The default backward (one kernel) forms dq and dk from the same rounded off-diagonal dS tile, and the two-kernel
    backward (deterministic mode) rounds one tile shared by both kernels, so the gate terms' roundings cancel in
    d(log g) (separate roundings measured 1.4-6x the floor: docs/kernels.md, Numerics); the fp32 tiles
    (offdiag_fp32_grads) have none."""
    out = tmp_path / "errors.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "tools.gate_grad_interpret", "--p", "2", "--d", "128", "--t", "512",
                           "--hq", "1", "--hk", "1", "--variants", "default", TWO_KERNELS, SWITCH, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    floor = rows["floor"]["dlog_g"]
    assert 0.002 < floor < 0.006, rows                 # bf16-sized: the inputs' own rounding
    for variant in ("default", TWO_KERNELS, SWITCH):    # shared roundings cancel, fp32 tiles have none
        assert rows[variant]["dlog_g"] < 1.5 * floor, (variant, rows)
        assert all(rows[variant][name] < 0.005 for name in ("dq", "dk", "dv")), rows
