"""scripts/tune_sym2.py --replot: the per-kernel profile plot from a saved run, without a GPU."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAVED = REPO / "docs" / "results" / "s16" / "tune_scan168_h100.json"


def test_replot_draws_every_kernel_of_a_saved_profile(tmp_path, import_script):
    src = tmp_path / "run.json"
    src.write_text(SAVED.read_text())
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "tune_sym2.py"), "--replot", str(src)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = tmp_path / "run_profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every kernel of the profile has a readable label of its own (torch's elementwise ops by kind and dtype: bars
    # with one label would be drawn on top of each other)
    tune_sym2 = import_script("tune_sym2")
    profile = json.loads(SAVED.read_text())["profile_best"]
    labels = [tune_sym2.label_of(k)[0] for k in profile]
    assert len(set(labels)) == len(labels) == len(profile), labels
    assert all(len(label) < 50 and not label.startswith("void") for label in labels), labels


def test_kernel_profiles_run_the_backward_on_one_stream(monkeypatch, import_script):
    """profile_kernels times one fwd+bwd with the backward's second stream off (overlapping kernels stretch each
    other's times), puts the switch back afterwards, and keeps both streams with --profile-streams."""
    import torch
    tune_sym2 = import_script("tune_sym2")
    seen = []
    monkeypatch.setattr(tune_sym2, "fwd_bwd", lambda xs, lg, chunk: seen.append(tune_sym2.triton_sym2.CONCURRENT_BWD))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class NoProfile:          # torch's profiler wants a CUDA build for CUDA activities: stand in, collecting nothing
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return []

    monkeypatch.setattr(torch.profiler, "profile", NoProfile)
    monkeypatch.setattr(tune_sym2.triton_sym2, "CONCURRENT_BWD", True)
    for kwargs, expected in (({}, False), ({"streams": True}, True)):
        seen.clear()
        tune_sym2.profile_kernels(None, None, 1024, **kwargs)
        assert seen == [expected, expected]
        assert tune_sym2.triton_sym2.CONCURRENT_BWD is True
