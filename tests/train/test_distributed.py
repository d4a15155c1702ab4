"""DDP on CPU (gloo): a 2-process run equals a 1-process run on the same global batch."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from longctx.eval import read_doc_record

REPO = Path(__file__).resolve().parents[2]


def final_params(run_dir: Path) -> dict:
    (path,) = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1:]
    return torch.load(path, map_location="cpu", weights_only=True)["model"]  # tensors and plain values only


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(train_env, tiny, tmp_path):
    args = [*tiny, "trainer.num_threads=1", "trainer.micro_docs=2"]
    one = subprocess.run([sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={tmp_path / 'one'}"],
                         env=train_env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(REPO / "train.py"), *args, f"hydra.run.dir={tmp_path / 'two'}"],
                         env=train_env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = final_params(tmp_path / "one"), final_params(tmp_path / "two")
    assert a.keys() == b.keys()
    for name in a:
        # same global batch, same schedule: only the order of floating-point sums differs
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)
    # only rank 0 writes: one metrics file, one line per evaluation
    assert len((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()) == 2
    # the per-document records: each rank's documents in their own rows, every row filled
    for step in (3, 6):
        ra, rb = (read_doc_record(tmp_path / run / "eval" / f"step_{step:08d}.npz") for run in ("one", "two"))
        assert rb["doc_index"].tolist() == ra["doc_index"].tolist() and rb["edges"].tolist() == ra["edges"].tolist()
        np.testing.assert_allclose(rb["loss"], ra["loss"], rtol=1e-4, atol=1e-5)
