"""Learning-rate schedule against its closed form; checkpoints atomic and pruned."""
import math
import os

import pytest
import torch

from longctx.train import checkpoint as ckpt
from longctx.train.optim import lr_at


def test_schedule_warmup_then_cosine_to_floor():
    kw = dict(lr=3e-4, min_lr=1e-5, warmup_steps=2000, max_steps=10000)
    assert math.isclose(lr_at(0, **kw), 3e-4 / 2000)
    assert math.isclose(lr_at(1999, **kw), 3e-4)
    mid = 2000 + 8000 // 2
    assert math.isclose(lr_at(mid, **kw), 1e-5 + 0.5 * (3e-4 - 1e-5))
    assert math.isclose(lr_at(10000, **kw), 1e-5)
    assert math.isclose(lr_at(20000, **kw), 1e-5)  # stays at the floor past the end
    lrs = [lr_at(s, **kw) for s in range(2000, 10001, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_checkpoints_atomic_and_keep_last(tmp_path):
    for step in (10, 20, 30):
        ckpt.save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((3,), float(step))}, keep=2)
    found = ckpt.list_checkpoints(tmp_path)
    assert [s for s, _ in found] == [20, 30]
    # a half-written temp file (a kill -9 mid-write) is never taken for a checkpoint
    (ckpt.checkpoint_dir(tmp_path) / ".step_00000040.pt.tmp123").write_bytes(b"garbage")
    step, path = ckpt.latest_checkpoint(tmp_path)
    assert step == 30 and torch.equal(ckpt.load_checkpoint(path)["w"], torch.full((3,), 30.0))
    assert not any(n.endswith(".pt") and n.startswith(".") for n in os.listdir(ckpt.checkpoint_dir(tmp_path)))


def test_no_checkpoint_in_empty_dir(tmp_path):
    assert ckpt.latest_checkpoint(tmp_path) is None
