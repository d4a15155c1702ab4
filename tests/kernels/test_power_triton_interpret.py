"""The Triton kernels themselves, on CPU, under TRITON_INTERPRET=1 (in a subprocess, so the variable
never reaches other tests), forward and gradients vs the reference. See _interpret_check.py."""
import os
import subprocess
import sys
from pathlib import Path


def test_triton_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("_interpret_check.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
