"""prepare_dataset: local text corpus -> LongCrawl64 layout -> the reader, round trip."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longctx.data import LongCrawl64, check_vocab, dataset_info, heldout_batch
from longctx.data.prepare import PrepareConfig, prepare_dataset

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_dataset.py"
L = 300


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 .txt documents of varied length (some shorter than L bytes), with multi-byte UTF-8."""
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "délta", "εψιλον", "数据", "long", "context", "\n"]
    texts = {}
    for i in range(40):
        n = int(rng.integers(10, 120))
        text = f"doc {i}: " + " ".join(words[k] for k in rng.integers(0, len(words), n))
        (d / f"{i:03d}.txt").write_text(text, encoding="utf-8")
        texts[i] = text
    return d, texts


def byte_ids(text):
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def unroll(row, eot):
    """Inverse of the roll: the EOT marks the seam; the document's first L-1 tokens follow it."""
    (e,) = np.flatnonzero(row == eot)
    return np.concatenate([row[e + 1:], row[:e]])


def test_round_trip_rolled(corpus, tmp_path, capsys):
    d, texts = corpus
    out = tmp_path / "ds"
    r = subprocess.run([sys.executable, str(SCRIPT), "--input", str(d), "--out", str(out), "--doc-len", str(L),
                        "--heldout-docs", "3", "--tokenizer", "bytes", "--chunk-docs", "4", "--chunk-len", "64",
                        "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    expected = {i: byte_ids(t)[:L - 1] for i, t in texts.items() if len(t.encode()) >= L}
    assert summary["documents_read"] == 40 and summary["documents_kept"] == len(expected) > 10
    assert (summary["train_docs"], summary["heldout_docs"]) == (len(expected) - 3, 3)

    info = dataset_info(out / "train.zarr")
    assert (info["bos_id"], info["vocab_size"], info["tokenizer"], info["rolled"]) == (256, 257, "bytes", True)
    assert info["chunks"] == (4, 64) and info["doc_len"] == L
    rows = np.concatenate([heldout_batch(out / s, L, n)["targets"].numpy()
                           for s, n in (("train.zarr", len(expected) - 3), ("heldout.zarr", 3))])
    found = sorted(int(bytes(unroll(row, 256)[:12].astype(np.uint8)).split(b":")[0][4:]) for row in rows)
    assert found == sorted(expected)  # every kept document exactly once, split disjointly
    for row in rows:
        doc = unroll(row, 256)
        i = int(bytes(doc[:12].astype(np.uint8)).split(b":")[0][4:])
        np.testing.assert_array_equal(doc, expected[i])
    assert len({int(np.flatnonzero(row == 256)[0]) for row in rows}) > 3  # seams at varied positions
    # the reader serves it in the authors' order
    train = np.asarray(rows[:len(expected) - 3])
    loader = LongCrawl64(out / "train.zarr", 100, 4)
    for i, batch in zip(range(len(loader)), iter(loader)):
        docs, pos = loader.rectangle(i)
        np.testing.assert_array_equal(batch["targets"].numpy(), train[docs, pos])
        assert (batch["inputs"][:, 0] == 256).all()
    loader.close()
    assert check_vocab(out / "train.zarr", 257) == 256
    with pytest.raises(ValueError, match="vocab_size=256"):
        check_vocab(out / "train.zarr", 256)
    # refuses to overwrite; --overwrite replaces
    spec = importlib.util.spec_from_file_location("prepare_dataset_cli", SCRIPT)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["--input", str(d), "--out", str(out), "--doc-len", str(L), "--quiet"]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert dataset_info(out / "train.zarr")["chunks"] == (4, 64)  # untouched


def test_unrolled_v2_json_and_overwrite(corpus, tmp_path):
    d, texts = corpus
    jsonl = tmp_path / "docs.jsonl"
    with open(jsonl, "w") as f:
        for i, t in texts.items():
            f.write(json.dumps({"id": i, "body": t}) + "\n")
    out = tmp_path / "ds"
    (out).mkdir()
    cfg = PrepareConfig(source=str(jsonl), out=str(out), doc_len=L, heldout_frac=0.2, tokenizer="bytes",
                        rolled=False, zarr_format=2, text_field="body", overwrite=True, progress=False, seed=5)
    s = prepare_dataset(cfg)
    info = dataset_info(out / "train.zarr")
    assert info["zarr_format"] == 2 and info["rolled"] is False
    expected = {bytes(byte_ids(t)[:L].astype(np.uint8)) for t in texts.values() if len(t.encode()) >= L}
    rows = np.concatenate([heldout_batch(out / f"{sp}.zarr", L, s[f"{sp}_docs"])["targets"].numpy()
                           for sp in ("train", "heldout")])
    assert {bytes(r.astype(np.uint8)) for r in rows} == expected and len(rows) == len(expected)
    assert s["heldout_docs"] == round(0.2 * len(expected))
    with pytest.raises(ValueError, match="'text' is not a column"):
        prepare_dataset(PrepareConfig(source=str(jsonl), out=str(tmp_path / "x"), doc_len=L, tokenizer="bytes",
                                      progress=False))
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".tmp-*"))


def test_bad_inputs(tmp_path, corpus):
    d, _ = corpus
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_dataset(PrepareConfig(source=str(tmp_path / "nope"), out=str(tmp_path / "o"), progress=False))
    with pytest.raises(ValueError, match="no document .* has >= doc_len=100000 tokens"):
        prepare_dataset(PrepareConfig(source=str(d), out=str(tmp_path / "o"), doc_len=100_000,
                                      tokenizer="bytes", progress=False))
    with pytest.raises(ValueError, match="tokenizer: must be one of"):
        prepare_dataset(PrepareConfig(source=str(d), out=str(tmp_path / "o"), tokenizer="sentencepiece",
                                      progress=False))
    assert not (tmp_path / "o").exists()


def test_each_real_file_is_read_once(tmp_path, corpus):
    """A link to a folder above (a loop) or an input named twice would read files again, duplicating documents and
    putting copies in both splits: each real file is read once, and an input that adds nothing is refused."""
    import shutil
    d, texts = corpus
    tree = tmp_path / "tree"
    shutil.copytree(d, tree)
    (tree / "loop").symlink_to(tree)
    summary = prepare_dataset(PrepareConfig(source=str(tree), out=str(tmp_path / "once"), doc_len=64,
                                            heldout_docs=2, tokenizer="bytes", progress=False))
    plain = prepare_dataset(PrepareConfig(source=str(d), out=str(tmp_path / "plain"), doc_len=64,
                                          heldout_docs=2, tokenizer="bytes", progress=False))
    assert (summary["train_docs"], summary["heldout_docs"]) == (plain["train_docs"], plain["heldout_docs"])
    import zarr
    train, held = (np.asarray(zarr.open(str(tmp_path / "once" / name), mode="r")[:])
                   for name in ("train.zarr", "heldout.zarr"))
    rows = {row.tobytes() for row in train}
    assert not any(row.tobytes() in rows for row in held)  # no document in both splits
    with pytest.raises(ValueError, match="every file in it was already read by an earlier input"):
        prepare_dataset(PrepareConfig(source=[str(d), str(d) + "/"], out=str(tmp_path / "twice"), doc_len=64,
                                      tokenizer="bytes", progress=False))
    assert not (tmp_path / "twice").exists()


def load_cli():
    spec = importlib.util.spec_from_file_location("prepare_dataset_cli", SCRIPT)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


@pytest.mark.parametrize("name", ["corpus.jsnol", "data/corpus.jsonl", "./corpus", "a/b/c"])
def test_mistyped_local_path_fails_at_once_naming_it(tmp_path, monkeypatch, capsys, name):
    """A local-looking name that does not exist is never looked up on the Hub (a lookup takes ~30 s offline)."""
    import datasets

    def no_hub(*args, **kwargs):
        raise AssertionError("looked up on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(tmp_path)
    assert load_cli().main(["--input", name, "--out", str(tmp_path / "o"), "--tokenizer", "bytes"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"prepare_dataset: error: input: {name!r} does not exist (a local path: no such file or folder)"]
    assert not (tmp_path / "o").exists()


def test_unreachable_hub_name_is_one_line(tmp_path, monkeypatch, capsys):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'owner/corpus' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert load_cli().main(["--input", "owner/corpus", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["prepare_dataset: error: input: 'owner/corpus' is not a local file or folder, and the Hub dataset "
                   "of that name could not be opened (ConnectionError: Couldn't reach 'owner/corpus' on the Hub "
                   "(LocalEntryNotFoundError))"]


def test_offline_auto_tokenizer_warns_at_the_start(corpus, tmp_path, monkeypatch, capsys):
    """Offline, --tokenizer auto falls back to bytes and says so on stderr before any work, not only in the
    summary; --tokenizer gpt2 stops instead."""
    from longctx.data import prepare

    def offline(self):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(prepare.TiktokenGPT2, "__init__", offline)
    d, _ = corpus
    cli = load_cli()
    assert cli.main(["--input", str(d), "--out", str(tmp_path / "o"), "--doc-len", str(L), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "prepare_dataset: warning: tokenizer auto: the GPT-2 vocabulary (tiktoken) could not be loaded "
        "(ConnectionError: Failed to resolve 'openaipublic.blob.core.windows.net'); using the byte-level tokenizer "
        "(vocab 257). Pass --tokenizer gpt2 to stop instead, or --tokenizer bytes to choose it"]
    assert json.loads(captured.out)["tokenizer"] == "bytes"
    assert cli.main(["--input", str(d), "--out", str(tmp_path / "o2"), "--tokenizer", "gpt2", "--quiet"]) == 2
    assert "tokenizer=gpt2: tiktoken could not load" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()
