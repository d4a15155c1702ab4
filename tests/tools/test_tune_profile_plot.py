"""tools/tune_sym2.py without a GPU: --replot draws the per-kernel profile plot of a saved run, and the kernel
profiles run the backward on one stream unless asked for two."""
import json
import subprocess
import sys
from pathlib import Path

from longctx.kernels.power.chunk_p2 import config as p2_config
from tools import tune_sym2

REPO = Path(__file__).resolve().parents[2]
PROFILE = {"gluon_outer": 9.6, "gluon_key_dk_rows": 8.3, "gluon_query_bwd_rows": 9.4, "gluon_query_fwd_rows": 6.2,
           "gluon_key_dv_rows": 4.8, "_attn_bwd_dkdv": 6.0, "_attn_bwd_dq": 4.3, "_attn_fwd": 3.5,
           "_norm_scan": 0.5, "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::"
           "BFloat16>>": 0.4, "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>":
           0.2, "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": 0.1}


def test_replot_draws_every_kernel_of_a_saved_profile(tmp_path):
    src = tmp_path / "run.json"
    src.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "profile_best": PROFILE,
                               "shape": {"t": 65536, "b": 8, "h": 12, "d": 64, "chunk": 512}}))
    proc = subprocess.run([sys.executable, "-m", "tools.tune_sym2", "--replot", str(src)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = tmp_path / "run_profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every kernel of the profile has a readable label of its own (torch's elementwise ops by kind and dtype: bars
    # with one label would be drawn on top of each other)
    labels = [tune_sym2.label_of(k)[0] for k in PROFILE]
    assert len(set(labels)) == len(labels) == len(PROFILE), labels
    assert all(len(label) < 50 and not label.startswith("void") for label in labels), labels


def test_kernel_profiles_run_the_backward_on_one_stream(monkeypatch):
    """profile_kernels times one fwd+bwd with the backward's second stream off (overlapping kernels stretch each
    other's times), leaves the config as it was, and keeps both streams with --profile-streams."""
    import torch
    seen = []
    monkeypatch.setattr(tune_sym2, "fwd_bwd", lambda xs, lg, chunk: seen.append(p2_config.current().concurrent_bwd))
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
    assert p2_config.current().concurrent_bwd is True
    for kwargs, expected in (({}, False), ({"streams": True}, True)):
        seen.clear()
        tune_sym2.profile_kernels(None, None, 1024, **kwargs)
        assert seen == [expected, expected]
        assert p2_config.current().concurrent_bwd is True
