"""scripts/tune_sym2.py --replot: the per-kernel profile plot from a saved run, without a GPU."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAVED = REPO / "docs" / "results" / "s15" / "tune_final_h200.json"


def test_replot_draws_every_kernel_of_a_saved_profile(tmp_path):
    src = tmp_path / "run.json"
    src.write_text(SAVED.read_text())
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "tune_sym2.py"), "--replot", str(src)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    png = tmp_path / "run_profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every kernel of the profile has a readable label (the harness's torch elementwise op by its kind)
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import tune_sym2
    finally:
        sys.path.remove(str(REPO / "scripts"))
    profile = json.loads(SAVED.read_text())["profile_best"]
    unlabeled = [k for k in profile if k not in tune_sym2.LABELS and "elementwise" not in k]
    assert not unlabeled, unlabeled
