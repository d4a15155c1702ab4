"""trainer.context_parallel=N on CPU (gloo): runs split along the context reproduce one process's run (losses, the
per-position curve, each document's binned losses, the final weights); a resume may change N; bad values are
refused naming the key; the reader's slices and the memory estimate.

Tolerances: the same global batch and schedule, only the order of floating-point sums differs (the attention's
exchange, the gradient all-reduce): losses 1e-5 absolute (the per-position curve: its 5 recorded decimals); weights
after 6 steps rtol 1e-4 / atol 5e-5 (measured: 1.6e-5 at most; AdamW divides each gradient by its own running
RMS, so an element whose gradient is near zero moves by an lr-sized step that round-off can change a little; lr is
3e-3).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from longctx.data import LongCrawl64
from longctx.eval import read_doc_record
from longctx.train.config import check_context_parallel, validate
from longctx.train.data import ContextSlices
from longctx.train.estimate import estimate, main as estimate_main
from longctx.train.resume import classify

REPO = Path(__file__).resolve().parents[2]
LOSS_TOL = 1e-5


def run(env, out: Path, args, nproc: int = 1):
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    done = subprocess.run([sys.executable, *launcher, str(REPO / "train.py"), *args, f"hydra.run.dir={out}"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def final_params(run_dir: Path) -> dict:
    path = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(run_dir: Path, one: Path, steps=(3, 6)):
    a, b = final_params(one), final_params(run_dir)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=5e-5, msg=name)
    ra, rb = records(one), records(run_dir)
    assert [r["step"] for r in rb] == [r["step"] for r in ra] == list(steps)
    for x, y in zip(ra, rb):
        for key in ("train_loss", "heldout_loss", "best_context_loss"):
            assert abs(x[key] - y[key]) <= LOSS_TOL, (x["step"], key, x[key], y[key])
        # the per-position curve, rounded to 5 decimals in the record: one unit of the last place apart at most
        np.testing.assert_allclose(y["per_position_loss"], x["per_position_loss"], rtol=0, atol=1.01e-5)
    for step in steps:   # each document's binned losses, every row filled
        da, db = (read_doc_record(r / "eval" / f"step_{step:08d}.npz") for r in (one, run_dir))
        assert db["doc_index"].tolist() == da["doc_index"].tolist()
        np.testing.assert_allclose(db["loss"], da["loss"], rtol=0, atol=LOSS_TOL)


@pytest.fixture(scope="module")
def cp_args(tiny_overrides):
    # power p=2 gated, chunk 8: the 32-token slices hold 4 chunks and carry a state across the ranks
    return [*tiny_overrides, "trainer.num_threads=1", "trainer.micro_docs=2", "attention=power",
            "attention.chunk_size=8"]


@pytest.fixture(scope="module")
def one_process(train_run, cp_args, tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("cp") / "one", cp_args)


@pytest.mark.slow
def test_context_parallel_2_matches_one_process(train_env, cp_args, one_process, tmp_path):
    two = run(train_env, tmp_path / "two", [*cp_args, "trainer.context_parallel=2"], nproc=2)
    assert_same_run(two, one_process)


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["exp_token_shift", "power"])
def test_data_parallel_2_by_context_parallel_2_matches_one_process(train_env, train_run, tiny_overrides, cp_args,
                                                                    one_process, arm, tmp_path):
    """4 ranks: CP groups {0, 1} and {2, 3}, each its 4 documents of a batch. Softmax with the token shift (the keys'
    all-gather and the previous token's halo), and power p=2 (the state exchange in a group that does not start at
    global rank 0: its gradients return to the ranks of that group)."""
    if arm == "power":
        args, one = cp_args, one_process
    else:
        args = [*tiny_overrides, "trainer.num_threads=1", "trainer.micro_docs=2", "attention=exp",
                "arch.token_shift=true"]
        one = train_run(tmp_path / "one", args)
    four = run(train_env, tmp_path / "four", [*args, "trainer.context_parallel=2"], nproc=4)
    assert_same_run(four, one)


@pytest.mark.slow
def test_context_parallel_recall_loss_at_the_queries_matches_one_process(train_env, train_run, tmp_path):
    """data.loss_on=queries: the pairs sit in the first slice and most queries in the second, so the two ranks count
    different numbers of targets; the step's loss divides by the world's count and matches one process's."""
    args = ["experiment=recall_state_cpu", "+experiment/arm=exp", "trainer.num_threads=1", "trainer.micro_docs=2",
            "trainer.max_steps=6", "trainer.eval_every=3", "trainer.stages=null", f"cache_dir={tmp_path / 'cache'}"]
    one = train_run(tmp_path / "one", args)
    two = run(train_env, tmp_path / "two", [*args, "trainer.context_parallel=2"], nproc=2)
    assert_same_run(two, one)
    for a, b in zip(records(one), records(two)):
        assert a["recall_accuracy"] == b["recall_accuracy"] and abs(a["recall_loss"] - b["recall_loss"]) <= LOSS_TOL


@pytest.mark.slow
def test_resume_changes_context_parallel(train_env, cp_args, one_process, tmp_path):
    """One process's run cut after its step-3 checkpoint, resumed with trainer.context_parallel=2 on 2 ranks: the
    same run (the checkpoint holds the whole model and the batch order; N is how the run runs)."""
    cut = tmp_path / "cut"
    shutil.copytree(one_process, cut)
    for path in (cut / "checkpoints").glob("step_00000006.*"):
        path.unlink()
    run(train_env, cut, [*cp_args, "trainer.context_parallel=2", "trainer.resume=true"], nproc=2)
    assert_same_run(cut, one_process)


# ----- fast: no processes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, key, words", [
    (["trainer.context_parallel=3"], "trainer.context_parallel=3", "must divide ctx=64"),
    (["trainer.context_parallel=0"], "trainer.context_parallel=0", "positive integer"),
    (["trainer.context_parallel=2", "arch=rwkv7", "attention=linear"], "trainer.context_parallel=2",
     "arch=rwkv7 has no context-parallel form"),
])
def test_bad_values_are_refused_by_name(compose, tiny, overrides, key, words):
    with pytest.raises(ValueError) as err:
        validate(compose(*tiny, *overrides))
    assert str(err.value).startswith(f"config: {key}: ") and words in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("world, key, words", [
    (3, "trainer.context_parallel=2", "must divide the world size 3"),
    (6, "data.docs_per_batch=8", "3 data-parallel ranks"),
])
def test_world_size_is_checked(compose, tiny, world, key, words):
    cfg = compose(*tiny, "trainer.context_parallel=2")
    with pytest.raises(ValueError, match=rf"^config: {key}: .*{words}"):
        check_context_parallel(cfg, world)
    check_context_parallel(cfg, 4)  # 2 DP x 2 CP ranks, 4 documents each


def test_a_resume_may_change_context_parallel():
    schedule, applied, refused = classify({"trainer.context_parallel": (1, 2)})
    assert applied == {"trainer.context_parallel": (1, 2)} and not refused and not schedule


def test_reader_slices_are_the_documents_cut_along_the_context(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=(16, 48), dtype=np.uint16)
    arr = zarr.create_array(str(tmp_path / "train.zarr"), shape=tokens.shape, chunks=(8, 16), dtype=tokens.dtype)
    arr[:] = tokens
    for dp_rank in range(2):    # 2 DP x 3 CP ranks, 4 documents a batch
        whole = LongCrawl64(str(tmp_path / "train.zarr"), 24, 4, rank=dp_rank, world_size=2)
        batches = [b for b, _ in zip(whole, range(3))]
        slices = []
        for cp_rank in range(3):
            reader = ContextSlices(LongCrawl64(str(tmp_path / "train.zarr"), 24, 4, rank=dp_rank, world_size=2),
                                   cp_rank, 3)
            slices.append([b for b, _ in zip(reader, range(3))])
            assert reader.state_dict() == whole.state_dict()      # a checkpoint does not depend on N
        for i, batch in enumerate(batches):
            for key in ("inputs", "targets"):
                assert torch.equal(torch.cat([s[i][key] for s in slices], dim=1), batch[key]), (dp_rank, i, key)
            # a slice's first input is the token before it, not the BOS of a document start
            assert torch.equal(slices[1][i]["inputs"][:, 0], slices[0][i]["targets"][:, -1])


def test_estimate_splits_the_context(compose, tiny):
    """N ranks of a CP group hold 1/N of a micro-batch's tokens each, plus their exchange (estimate's docstring)."""
    one = estimate(compose(*tiny, "attention=power", "ctx=4096"), torch.device("cpu"), _spec, rate=0.0)
    cfg = compose(*tiny, "attention=power", "ctx=4096", "trainer.context_parallel=4")
    four = estimate(cfg, torch.device("cpu"), _spec, world_size=4, rate=0.0)
    assert four.micro_docs == one.micro_docs
    assert one.activation_bytes / 4 < four.activation_bytes < one.activation_bytes / 3, (one, four)


def _spec(vocab):
    from longctx.models import ModelSpec
    return ModelSpec(attention="power", vocab_size=vocab, d_model=64, n_layers=3, n_heads=2, ctx=4096)


def test_estimate_command_prints_the_longest_context(capsys):
    args = ["--gpus", "4", "--memory-gib", "80", "attention=power", "model=small", "trainer.micro_docs=1"]
    assert estimate_main(args) == 0
    out = capsys.readouterr().out
    plain, ckpt = (int(line.split()[-1]) for line in out.splitlines() if line.startswith("longest ctx that fits"))
    assert 1024 <= plain < ckpt     # checkpointing keeps less per token: a longer context fits
    rows = {int(line.split()[0]): float(line.split()[1]) for line in out.splitlines() if line.split()[0].isdigit()}
    assert rows[2 * plain] > 0.9 * 80 >= rows[plain]    # the longest that fits, and the next one does not
    assert estimate_main(["--gpus", "2", "arch=rwkv7", "attention=linear"]) == 2
    assert "trainer.context_parallel=2: arch=rwkv7" in capsys.readouterr().err


@pytest.mark.parametrize("override,named", [("model=smal", "model=smal: no such model option; did you mean small?"),
                                            ("trainer.max_stepz=3", "did you mean trainer.max_steps?")])
def test_estimate_command_names_a_mistyped_override_in_one_line(capsys, override, named):
    """As train.py: a typo is one `error:` line with the closest valid name, exit 2, not Hydra's traceback."""
    assert estimate_main([override]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: config: {override}: ") and named in lines[0], lines
