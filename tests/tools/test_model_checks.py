"""tools/model_checks.sh without a GPU (nvidia-smi, python3 and the device setup stubbed; the arguments recorded):
the test stages spread their xdist workers over the GPUs and keep every result in a log under $OUT; a misspelt stage
is one line, before anything is installed or run."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path, *stages, **env_extra):
    (tmp_path / "tools").mkdir()
    shutil.copy(REPO / "tools" / "model_checks.sh", tmp_path / "tools")
    (tmp_path / "tools" / "setup_device.sh").write_text("touch SETUP_RAN\n")
    (tmp_path / "tools" / "keep_autotune.sh").write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in {"nvidia-smi": 'echo "GPU 0"; echo "GPU 1"',
                       "python3": 'echo "$*" >> "$ARGS_FILE"; echo "3 passed in 1.0s"',
                       "timeout": 'echo "$1" >> "$LIMITS_FILE"; shift; exec "$@"'}.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", ARGS_FILE=str(tmp_path / "args.txt"),
               OUT=str(tmp_path / "out"), LIMITS_FILE=str(tmp_path / "limits.txt"), **env_extra)
    return subprocess.run(["bash", "tools/model_checks.sh", *stages], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_test_stages_spread_workers_over_the_gpus_and_log_every_result(tmp_path):
    proc = _run(tmp_path, "kernels", "tests", "decode")
    assert proc.returncode == 0, proc.stderr
    kernels, tests, decode = (tmp_path / "args.txt").read_text().splitlines()
    assert kernels.startswith("-m pytest -n 8 -v ") and "tests/kernels -m gpu" in kernels   # 4 workers a GPU, 2 GPUs
    assert tests.startswith("-m pytest -n 4 -v ") and "tests/models tests/train tests/eval -m gpu" in tests
    assert decode.startswith("-m pytest -n 6 -v ") and "tests/models/test_decoding_gpu.py -m gpu" in decode
    for log in ("kernel_tests.log", "gpu_tests.log", "decode_tests.log"):
        assert (tmp_path / "out" / log).read_text() == "3 passed in 1.0s\n"
    assert proc.stdout.count("3 passed") == 3


def test_a_misspelt_stage_is_one_line_and_nothing_runs(tmp_path):
    proc = _run(tmp_path, "kernels", "kernel")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown stage 'kernel'" in proc.stderr
    assert not (tmp_path / "args.txt").exists() and not (tmp_path / "SETUP_RAN").exists()
    assert not (tmp_path / "out").exists()


def test_kernel_bench_runs_the_readme_tables_command(tmp_path):
    """The kernel-bench stage runs scripts/bench_attention.py with the contexts and skips of the README kernel table's
    command (docs/kernels.md), its record under $OUT."""
    proc = _run(tmp_path, "kernel-bench")
    assert proc.returncode == 0, proc.stderr
    (args,) = (tmp_path / "args.txt").read_text().splitlines()
    doc = (REPO / "docs" / "kernels.md").read_text()
    command = doc.split("### The README's kernel table")[1].split("```")[1]
    assert args.startswith("scripts/bench_attention.py ") and f"--out {tmp_path / 'out'}/bench_attention" in args
    for flag in ("--ctxs", "--skip"):
        value = re.search(flag + r" (\S+)", command).group(1)
        assert f"{flag} {value}" in args, (flag, value, args)


def test_stage_s_sets_each_stages_limit_and_a_bad_one_is_one_line(tmp_path):
    """STAGE_S bounds each stage below the call's own limit (so the autotune winners are kept when a call has less than
    ten minutes left); the test stages keep 20 s for their logs."""
    default, short, bad, low = (tmp_path / n for n in ("default", "short", "bad", "low"))
    for folder in (default, short, bad, low):
        folder.mkdir()
    assert _run(default, "kernel-bench", "kernels").returncode == 0
    assert (default / "limits.txt").read_text().split() == ["580", "560"]
    assert _run(short, "kernel-bench", "kernels", STAGE_S="300").returncode == 0
    assert (short / "limits.txt").read_text().split() == ["300", "280"]
    for folder, value, words in ((bad, "5m", "STAGE_S='5m' is not a whole number"), (low, "30", "under 60 seconds")):
        proc = _run(folder, "kernel-bench", STAGE_S=value)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
        assert not (folder / "args.txt").exists() and not (folder / "SETUP_RAN").exists()
