"""The evaluation loop and evaluate's tasks on a CUDA device (bf16 autocast): the numbers agree with the CPU's fp32
evaluation of the same checkpoint, and the per-document record still averages to the curve."""
from __future__ import annotations

import json

import numpy as np
import pytest

from longctx.eval import read_doc_record
from longctx.evaluate import main as evaluate_main

pytestmark = pytest.mark.gpu
TRAIN = ["optim.warmup_steps=1",
         "trainer.max_steps=4", "trainer.eval_every=4", "logger.wandb.mode=disabled", "data.train_tokens=65536",
         "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
         "trainer.num_threads=2", "attention=power", "p=2", "attention.chunk_size=16", "device=cpu"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "power", TRAIN)


def test_heldout_on_cuda_agrees_with_cpu(run, tmp_path):
    recs = {}
    for device, precision in (("cpu", "fp32"), ("cuda", "bf16"), ("cuda", "fp32")):
        out = tmp_path / f"{device}_{precision}.json"
        assert evaluate_main([str(run), "--ctx", "128", "--docs", "8", "--device", device, "--precision", precision,
                              "--out", str(out)]) == 0
        recs[device, precision] = json.loads(out.read_text())
        doc = read_doc_record(out.with_suffix(".npz"))
        np.testing.assert_allclose(doc["loss"].astype(np.float64).mean(0),
                                   [c[2] for c in recs[device, precision]["icl_curve"]], rtol=0, atol=2e-6)
    cpu = np.array(recs["cpu", "fp32"]["per_position_loss"])
    np.testing.assert_allclose(recs["cuda", "fp32"]["per_position_loss"], cpu, rtol=0, atol=2e-3)  # TF32 matmuls
    np.testing.assert_allclose(recs["cuda", "bf16"]["per_position_loss"], cpu, rtol=0, atol=5e-2)


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_retrieval_on_cuda(run, tmp_path, task):
    out = tmp_path / f"{task}.json"
    assert evaluate_main([str(run), "--task", task, "--contexts", "40,64", "--trials", "4", "--device", "cuda",
                          "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert np.shape(rec["key_accuracy"]) == (2, 5) and 0 <= rec["mean_digit_accuracy"] <= 1
