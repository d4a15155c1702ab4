"""The LongCrawl64 reader against a direct numpy implementation of the authors' sampler."""
import itertools

import numpy as np
import pytest
import torch
import zarr

from lc64_fixtures import random_tokens, write_v3
from longctx.data import LongCrawl64, check_vocab, dataset_info, heldout_batch


def reference_batch(data, index, B, T, bos):
    """The authors' Dataloader.__getitem__ (manifestai.com/articles/longcrawl64), transcribed in numpy."""
    doc_count = data.shape[0] - data.shape[0] % B
    doc_length = data.shape[1] - data.shape[1] % T
    n_batches = doc_count * doc_length // (B * T)
    index = index % n_batches
    row_chunks = doc_count // B
    context_idx = (index // row_chunks) * T
    document_idx = (index % row_chunks) * B
    targets = data[document_idx:document_idx + B, context_idx:context_idx + T].astype(np.int64)
    inputs = np.roll(targets, 1, axis=-1)
    inputs[:, 0] = bos
    return inputs, targets, n_batches


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


# (B, T, max_block_bytes): B not dividing the doc chunk (16), T not dividing doc_len (100) or chunk (32),
# blocks smaller than one batch, and a batch bigger than a chunk.
CASES = [(4, 32, 512 << 20), (6, 25, 512 << 20), (5, 7, 64), (20, 50, 512 << 20), (1, 100, 512 << 20)]


@pytest.mark.parametrize("B,T,max_block_bytes", CASES, ids=[f"B{b}-T{t}-blk{m}" for b, t, m in CASES])
def test_order_matches_authors_sampler(lc64_array, B, T, max_block_bytes):
    path, data = lc64_array
    loader = LongCrawl64(path, T, B, max_block_bytes=max_block_bytes)
    _, _, n_batches = reference_batch(data, 0, B, T, 50256)
    assert len(loader) == n_batches
    got = take(loader, n_batches + 3)  # runs over the epoch boundary: same order again
    for i, batch in enumerate(got):
        inputs, targets, _ = reference_batch(data, i, B, T, 50256)
        assert batch["targets"].dtype == torch.int64 and batch["inputs"].dtype == torch.int64
        np.testing.assert_array_equal(batch["targets"].numpy(), targets, err_msg=f"batch {i}")
        np.testing.assert_array_equal(batch["inputs"].numpy(), inputs, err_msg=f"batch {i}")
    assert loader.epoch == 1
    loader.close()


@pytest.mark.parametrize("W", [2, 4])
def test_rank_shares_disjoint_and_complete(lc64_array, W):
    path, data = lc64_array
    B, T = 8, 20
    loaders = [LongCrawl64(path, T, B, rank=r, world_size=W, max_block_bytes=100) for r in range(W)]
    per_rank = [take(ld, len(ld)) for ld in loaders]
    for i in range(len(loaders[0])):
        shares = [per_rank[r][i]["targets"].numpy() for r in range(W)]
        assert all(s.shape == (B // W, T) for s in shares)
        _, targets, _ = reference_batch(data, i, B, T, 50256)
        np.testing.assert_array_equal(np.concatenate(shares), targets)  # complete, in rank order
        docs = [set(range(*ld.rectangle(i)[0].indices(10**9))) for ld in loaders]
        assert sum(len(d) for d in docs) == len(set().union(*docs)) == B  # disjoint
    for ld in loaders:
        ld.close()


def test_resume_mid_epoch_equals_uninterrupted(lc64_array):
    path, _ = lc64_array
    B, T = 4, 30
    straight = take(LongCrawl64(path, T, B, rank=1, world_size=2), 40)
    first = LongCrawl64(path, T, B, rank=1, world_size=2)
    head = take(first, 17)          # the producer thread has already read ahead of this point
    state = first.state_dict()
    assert state["batch"] == 17
    first.close()
    resumed = LongCrawl64(path, T, B, rank=1, world_size=2)
    resumed.load_state_dict(state)
    tail = take(resumed, 23)
    for i, (a, b) in enumerate(zip(straight, head + tail)):
        assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"]), i
    # load_state_dict on a live reader restarts from the loaded point; the old iterator refuses to go on
    old = iter(resumed)
    next(old)
    resumed.load_state_dict({"batch": 3})
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)
    assert torch.equal(next(iter(resumed))["targets"], straight[3]["targets"])
    resumed.close()
    with pytest.raises(ValueError, match="context_length"):
        LongCrawl64(path, T + 1, B).load_state_dict(state)


def test_reshape_block(lc64_array):
    path, data = lc64_array
    B, T, K = 4, 40, 8
    loader = LongCrawl64(path, T, B, reshape_block=K)
    for i, batch in enumerate(take(loader, len(loader))):
        _, targets, _ = reference_batch(data, i, B, T, 50256)
        assert batch["targets"].shape == (B * T // K, K)
        np.testing.assert_array_equal(batch["targets"].numpy(), targets.reshape(-1, K))
        assert (batch["inputs"][:, 0] == 50256).all()  # every block starts fresh: no context beyond K
        np.testing.assert_array_equal(batch["inputs"][:, 1:].numpy(), targets.reshape(-1, K)[:, :-1])
    loader.close()
    with pytest.raises(ValueError, match="reshape_block=7 must divide"):
        LongCrawl64(path, T, B, reshape_block=7)


def test_bos_from_attrs_and_argument(tmp_path):
    data = random_tokens(8, 16, vocab=7)
    path = write_v3(tmp_path / "a.zarr", data, (4, 8), attrs={"bos_id": 7, "vocab_size": 8})
    assert (next(iter(LongCrawl64(path, 8, 2)))["inputs"][:, 0] == 7).all()
    assert (next(iter(LongCrawl64(path, 8, 2, bos_id=3)))["inputs"][:, 0] == 3).all()
    assert LongCrawl64(path, 8, 2).vocab_size == 8


def test_heldout_batch_and_info(lc64_array):
    path, data = lc64_array
    h = heldout_batch(path, 64, 10)
    np.testing.assert_array_equal(h["targets"].numpy(), data[:10, :64])
    np.testing.assert_array_equal(h["inputs"][:, 1:].numpy(), data[:10, :63])
    assert (h["inputs"][:, 0] == 50256).all() and h["bayes_nll"] is None
    info = dataset_info(path)
    assert (info["num_docs"], info["doc_len"], info["dtype"], info["bos_id"]) == (50, 100, "uint16", 50256)
    assert info["zarr_format"] == (2 if "v2" in str(path) else 3)


def test_check_vocab(tmp_path):
    data = random_tokens(40, 64, vocab=100)
    data[33, 17] = 500
    path = write_v3(tmp_path / "a.zarr", data, (8, 16), attrs={"bos_id": 0})
    assert check_vocab(path, 501) == 500
    with pytest.raises(ValueError, match=r"token id 500 at document 33, position 17 .* vocab_size=200"):
        check_vocab(path, 200)
    with pytest.raises(ValueError, match="bos_id=50256 >= model vocab_size=501"):
        check_vocab(LongCrawl64(path, 16, 4, bos_id=50256), 501)
    # large arrays are sampled chunk by chunk; the recorded max_token_id attribute short-cuts the scan
    assert check_vocab(path, 600, max_scan_tokens=128) <= 500
    p2 = write_v3(tmp_path / "b.zarr", data, (8, 16), attrs={"max_token_id": 500, "bos_id": 0})
    with pytest.raises(ValueError, match="token id 500"):
        check_vocab(p2, 300)


def test_bad_input_errors(tmp_path, lc64_array):
    path, _ = lc64_array
    with pytest.raises(FileNotFoundError, match="data.path: .*nope.zarr' does not exist"):
        LongCrawl64(tmp_path / "nope.zarr", 8, 2)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="data.path: .*plain' is not a zarr array"):
        LongCrawl64(tmp_path / "plain", 8, 2)
    root = tmp_path / "ds"
    write_v3(root / "train.zarr", random_tokens(4, 8), (4, 8))
    with pytest.raises(ValueError, match="is not a zarr array .*point at one split"):
        LongCrawl64(root, 8, 2)
    zarr.open_group(str(tmp_path / "grp"), mode="w")
    with pytest.raises(ValueError, match="not a zarr array"):
        LongCrawl64(tmp_path / "grp", 8, 2)
    write_v3(tmp_path / "f.zarr", np.zeros((4, 8), np.float32), (4, 8))
    with pytest.raises(ValueError, match="dtype float32"):
        LongCrawl64(tmp_path / "f.zarr", 8, 2)
    write_v3(tmp_path / "r3.zarr", np.zeros((2, 4, 8), np.uint16), (2, 4, 8))
    with pytest.raises(ValueError, match=r"shape \(2, 4, 8\) \(rank 3\)"):
        LongCrawl64(tmp_path / "r3.zarr", 8, 2)
    with pytest.raises(ValueError, match=r"ctx\)=128 > doc_len=100"):
        LongCrawl64(path, 128, 2)
    with pytest.raises(ValueError, match="docs_per_batch=6 is not divisible by world_size=4"):
        LongCrawl64(path, 8, 6, rank=0, world_size=4)
    with pytest.raises(ValueError, match=r"rank=4 must be an integer in \[0, world_size=4\)"):
        LongCrawl64(path, 8, 8, rank=4, world_size=4)
    with pytest.raises(ValueError, match="docs_per_batch=64 > num_docs=50"):
        LongCrawl64(path, 8, 64)
    with pytest.raises(ValueError, match="context_length"):
        LongCrawl64(path, 0, 2)
    with pytest.raises(ValueError, match=r"ctx\)=128 > doc_len=100"):
        heldout_batch(path, 128, 2)
    with pytest.raises(ValueError, match="num_docs=51 > the 50 documents"):
        heldout_batch(path, 8, 51)


def test_reader_error_surfaces_in_consumer(tmp_path, monkeypatch):
    loader = LongCrawl64(write_v3(tmp_path / "a.zarr", random_tokens(8, 16), (4, 8)), 8, 2)

    def broken(key):
        raise OSError(f"disk gone while reading block {key}")

    monkeypatch.setattr(loader, "_read_block", broken)
    with pytest.raises(OSError, match="disk gone"):
        next(iter(loader))
    loader.close()
