"""Packed documents end to end: prepare_dataset --pack writes rows of whole documents, the reader numbers them, a
config that packs data without boundaries is refused in one line, the heldout evaluation bins by position within
each document (checked against every document run alone), and a CPU training run with data.pack=true runs."""
import json

import numpy as np
import pytest
import torch

from longctx.data import LongCrawl64, dataset_info, heldout_batch
from longctx.data.longcrawl64 import joined_documents, packed_doc_ids
from longctx.data.prepare import PrepareConfig, prepare_dataset
from longctx.eval import HeldoutEvaluation
from longctx.eval.metrics import icl_summary, min_positions_for
from longctx.models import ModelSpec, build_model
from longctx.train.config import validate
from longctx.train.data import resolve_splits

L = 128      # row length
EOT = 256    # the byte tokenizer's EOT / BOS


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """60 text files of 1 to ~150 bytes (shorter and longer than a row), multi-byte UTF-8 among them."""
    d = tmp_path_factory.mktemp("pack_corpus")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "délta", "数据", "x", "\n"]
    out = {}
    for i in range(60):
        text = " ".join(words[k] for k in rng.integers(0, len(words), int(rng.integers(1, 40))))
        (d / f"{i:03d}.txt").write_text(text, encoding="utf-8")
        out[i] = text.encode("utf-8")
    return d, out


@pytest.fixture(scope="module")
def packed(texts, tmp_path_factory):
    d, _ = texts
    out = tmp_path_factory.mktemp("packed") / "ds"
    summary = prepare_dataset(PrepareConfig(source=str(d), out=str(out), doc_len=L, heldout_docs=3, tokenizer="bytes",
                                            pack=True, chunk_docs=4, chunk_len=32, progress=False))
    return out, summary


def test_prepare_pack_rows_hold_whole_documents(texts, packed):
    _, by_id = texts
    out, summary = packed
    info = dataset_info(out / "train.zarr")
    assert info["packed"] and info["rolled"] is False and info["bos_id"] == EOT
    n_train, n_held = summary["train_docs"], summary["heldout_docs"]
    assert n_held == 3 and n_train + n_held == summary["documents_kept"] > 10
    rows = np.concatenate([heldout_batch(out / s, L, n)["targets"].numpy()
                           for s, n in (("train.zarr", n_train), ("heldout.zarr", n_held))])
    known = set(by_id.values())
    whole = cut = 0
    for row in rows:  # each row: documents, each its bytes then EOT; only the last may be cut at the row's end
        pieces = bytes(np.where(row == EOT, 0, row).astype(np.uint8)).split(b"\0")
        for piece in pieces[:-1]:  # a text, or the first L - 1 bytes of a longer one
            assert piece in known or (len(piece) == L - 1 and any(t.startswith(piece) for t in known)), piece
            whole += 1
        if pieces[-1]:
            assert any(t.startswith(pieces[-1]) for t in known), pieces[-1]  # (all but its EOT, at the least)
            cut += 1
    assert whole + cut == summary["packed_documents"] and whole > len(rows)  # rows hold several documents
    # the reader: every document of the inputs starts at a BOS and is numbered from 0 along its row
    reader = LongCrawl64(str(out / "train.zarr"), L, 4, packed=True)
    batch = reader.batch(0)
    reader.close()
    inputs, ids = batch["inputs"], batch["doc_ids"]
    assert (ids[:, 0] == 0).all() and ((ids[:, 1:] - ids[:, :-1]) >= 0).all()
    assert torch.equal(ids[:, 1:] != ids[:, :-1], inputs[:, 1:] == EOT)


def test_joined_documents_are_the_split_without_boundaries(packed):
    """The needle task's haystacks of a packed split: its tokens in order, every EOT/BOS left out."""
    out, summary = packed
    rows = heldout_batch(out / "train.zarr", L, summary["train_docs"])["targets"].numpy().reshape(-1)
    text = rows[rows != EOT]
    stacks = joined_documents(out / "train.zarr", 100, 5)
    assert stacks.shape == (5, 100) and stacks.dtype == np.int64
    assert np.array_equal(stacks.reshape(-1), text[:500])
    assert joined_documents(out / "train.zarr", 100, 10 ** 6).shape == (len(text) // 100, 100)  # as many as there are


def test_pack_refused_without_boundaries(compose, tmp_path, packed):
    for data in ("mqar", "icl_markov"):
        with pytest.raises(ValueError, match=rf"^config: data\.pack=True: data={data} generates fixed-length") as err:
            validate(compose(f"data={data}", "data.pack=true"))
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"^config: data\.pack=True: cannot be combined with data\.reshape_block"):
        validate(compose("data=longcrawl64", "data.path=x", "data.pack=true", "data.reshape_block=16"))
    # a prepared rectangle (one document a row) has no boundaries: refused when the arrays are opened
    rect = tmp_path / "rect"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("x" * 300)
    (src / "b.txt").write_text("y" * 300)
    prepare_dataset(PrepareConfig(source=str(src), out=str(rect), doc_len=64, heldout_docs=1, tokenizer="bytes",
                                  progress=False))
    cfg = compose("data=longcrawl64", f"data.path={rect}", "data.pack=true", "ctx=64")
    validate(cfg)
    with pytest.raises(ValueError, match=r"^data\.pack=true: .*train\.zarr holds no document boundaries") as err:
        resolve_splits(cfg.data, 64)
    assert "\n" not in str(err.value)
    resolve_splits(compose("data=longcrawl64", f"data.path={packed[0]}", "data.pack=true", "ctx=64").data, 64)


def test_heldout_curve_is_by_position_within_each_document():
    """Per-position loss, ICL curve and best context of packed rows equal those of their documents run alone, binned
    by position within each document; positions no document reaches are NaN and left out of the bins."""
    torch.manual_seed(0)
    model = build_model(ModelSpec(vocab_size=EOT + 1, d_model=16, n_layers=1, n_heads=2, ctx=64)).double().eval()
    g = torch.Generator().manual_seed(0)
    lengths = [[20, 5, 9, 30], [1, 40, 23], [64]]      # documents of each row (the last reaches every position)
    T, n = 64, len(lengths)
    targets = torch.randint(0, EOT, (n, T), generator=g)
    for r, row in enumerate(lengths):                   # each document's last target is its EOT
        for end in np.cumsum(row)[:-1]:
            targets[r, end - 1] = EOT
    inputs = torch.cat([torch.full((n, 1), EOT), targets[:, :-1]], dim=1)
    heldout = {"inputs": inputs, "targets": targets, "doc_ids": packed_doc_ids(inputs, EOT)}
    assert [torch.bincount(row).tolist() for row in heldout["doc_ids"]] == lengths
    evaluation = HeldoutEvaluation(heldout, num_bins=4)
    result = evaluation.run(model, micro_docs=2, precision="fp32")

    total, count = np.zeros(T), np.zeros(T)
    row_bins = np.zeros((n, len(evaluation.edges), 2))  # each row's (sum, tokens) in each bin of document positions
    with torch.no_grad():
        for r, row in enumerate(lengths):
            lo = 0
            for m in row:                               # the document alone: its own BOS first, positions from 0
                nll = model(inputs[r:r + 1, lo:lo + m], targets[r:r + 1, lo:lo + m])[0].double().numpy()
                total[:m] += nll
                count[:m] += 1
                for i, (a, b) in enumerate(evaluation.edges):
                    row_bins[r, i] += [nll[a:b].sum(), len(nll[a:b])]
                lo += m
    want = total / count
    np.testing.assert_allclose(result.per_position, want, rtol=1e-10)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(result.doc_loss, row_bins[..., 0] / row_bins[..., 1], rtol=1e-10)  # NaN: none
    assert result.finite and result.reached.all() and (count == np.array(
        [sum(m > p for row in lengths for m in row) for p in range(T)])).all()
    assert result.summary["best_context_loss"] == pytest.approx(icl_summary(want, 4)["best_context_loss"], rel=1e-10)

    # without the long row, positions past 40 are reached by no document: NaN, left out of the curve
    short = {k: v[:2] for k, v in heldout.items()}
    res = HeldoutEvaluation(short, num_bins=4).run(model, micro_docs=2, precision="fp32")
    assert np.isnan(res.per_position[40:]).all() and np.isfinite(res.per_position[:40]).all() and res.finite
    assert res.mean_loss == pytest.approx(want_short := res.per_position[:40].mean(), rel=1e-12)  # the heldout loss
    assert np.isfinite(want_short) and result.mean_loss == pytest.approx(want.mean(), rel=1e-12)
    assert np.isfinite(res.summary["best_context_loss"])
    edges = HeldoutEvaluation(short, num_bins=4).edges
    means = [res.per_position[a:min(b, 40)].mean() for a, b in edges if b - a >= min_positions_for(T) and a < 40]
    assert res.summary["best_context_loss"] == pytest.approx(min(means), rel=1e-12)


@pytest.mark.slow
def test_cpu_training_run_with_pack(packed, compose, tmp_path):
    """A short CPU run on the packed corpus: it trains, and its ICL curve covers the row by document position."""
    from longctx.train.trainer import Trainer

    out, _ = packed
    run = tmp_path / "run"
    trainer = Trainer(compose("data=source_corpus", f"data.path={out}", "data.pack=true", f"ctx={L}", "model=tiny",
                              "trainer.max_steps=2", "trainer.eval_every=2", "optim.warmup_steps=1",
                              "data.docs_per_batch=4", "data.eval_docs=3", "logger.wandb.mode=disabled",
                              "trainer.num_threads=2", "trainer.compile=false", f"run_dir={run}"))
    calls = []  # (training?, the doc_ids the model was given) of every forward
    trainer.model.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append((torch.is_grad_enabled(), kwargs.get("doc_ids"))), with_kwargs=True)
    trainer.fit()
    assert {grad for grad, _ in calls} == {True, False}  # training steps and the evaluation
    for _, doc_ids in calls:  # every forward, training and heldout, saw the rows' documents
        assert doc_ids is not None and doc_ids.shape[1] == L and (doc_ids[:, -1] > 0).any()
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 2 and np.isfinite(last["best_context_loss"]) and last["icl_curve"][-1][1] == L
    assert np.isfinite(last["train_loss"])
    # the report tables and draws it; no interval (each row's bin means cannot resample the per-position means)
    from longctx.report.cli import main as report_main
    from longctx.report.stats import load_doc_bins
    docs = load_doc_bins(run / last["doc_bins"])
    assert docs.packed and np.isnan(docs.loss).any()
    report = report_main([str(run), "--out", str(tmp_path / "report"), "--bootstrap", "50"])
    text = report.read_text()
    assert f"{last['best_context_loss']:.3f}" in text  # the trainer's number, as metrics.jsonl has it
    rows = [line for line in text.splitlines() if line.startswith("| exp")]
    assert rows[-1].split("|")[5].strip() == "-"  # the intervals table: no interval for a packed run
    # the retrieval evaluation reads the packed heldout text as haystacks
    from longctx.evaluate import main as evaluate_main
    needle = tmp_path / "needle.json"
    assert evaluate_main([str(run), "--task", "needle", "--contexts", "64", "--depths", "0,1", "--trials", "2",
                          "--digits", "2", "--device", "cpu", "--out", str(needle)]) == 0
    assert json.loads(needle.read_text())["contexts"] == [64]
