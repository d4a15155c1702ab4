"""Real text offline: packages of source trees as long documents, a byte-level BPE tokenizer trained on the training
split, and a training run on the result through the real CLI."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from longctx.data import dataset_info, heldout_batch
from longctx.data.corpus import CorpusStats, package_texts
from longctx.data.tokenizer import EOT, BPETokenizer, ByteTokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "prepare_dataset.py"

HARD_TEXTS = [
    "def f(x):\n\tif x:\n        return {'a': [1, 2]}  # comment\r\n",
    "   leading and trailing runs    \n\n\n\t \u00a0\u3000",
    "unicode: héllo wörld — 数据 😀 \U0001f9ea e\u0301 ﬁ",
    f"a literal {EOT} inside text, and a NUL \x00 byte",
    "",
    " ",
]


def load_cli():
    spec = importlib.util.spec_from_file_location("prepare_dataset_cli", SCRIPT)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


# ----- the tokenizer ----------------------------------------------------------------------------------------------
def test_bpe_round_trips_any_text_exactly(tmp_path):
    train = [open(__file__, encoding="utf-8").read(), *HARD_TEXTS[:3]] * 3
    tok = BPETokenizer.train(iter(train), 400)
    assert tok.vocab_size == 400 and tok.eot_id == 0 and tok.name == "bpe-400"
    for text in HARD_TEXTS + train:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eot_id not in ids                   # EOT only ever comes from the data writer
    assert len(tok.encode("def f(x):\n")) < len("def f(x):\n".encode())  # it did learn merges
    tok.save(tmp_path / "tokenizer.json")
    again = BPETokenizer.from_file(tmp_path / "tokenizer.json")
    assert all(again.encode(t) == tok.encode(t) for t in HARD_TEXTS)
    batch = tok.encode_batch(HARD_TEXTS)
    assert [list(b) for b in batch] == [tok.encode(t) for t in HARD_TEXTS]


def test_byte_tokenizer_round_trips():
    tok = ByteTokenizer()
    for text in HARD_TEXTS:
        assert tok.encode(text) == list(text.encode("utf-8")) and tok.decode(tok.encode(text)) == text


# ----- the corpus: packages, order, headers, dedup ----------------------------------------------------------------
def make_tree(root: Path, packages: dict) -> None:
    for rel, content in packages.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def test_packages_in_import_order_with_headers_and_duplicates_once(tmp_path, caplog):
    make_tree(tmp_path / "site", {
        "alpha/z.py": "Z = 1\n", "alpha/__init__.py": "from .a import A\n", "alpha/a.py": "A = 2",
        "alpha/sub/__init__.py": "", "alpha/sub/m.py": "M = 3\n", "alpha/README": "read me\n",
        "alpha/__pycache__/a.cpython-311.pyc": b"\x00\x01", "alpha/lib.so": b"\x7fELF\x00",
        "alpha/data.py": b"BIN = '\x00'\n", "alpha/latin.py": b"# caf\xe9\n",
        "alpha-1.0.dist-info/METADATA": "Name: alpha\n", ".hidden/x.py": "secret\n",
        "beta/__init__.py": "Z = 1\n",           # identical to alpha/z.py: kept once, in alpha (first by name)
        "beta/big.py": "x" * 200, "six.py": "six = 6\n",
    })
    make_tree(tmp_path / "doc", {"beta/notes.md": "# notes\n"})   # same package name in a second input
    stats = CorpusStats()
    got = dict(package_texts([tmp_path / "site", tmp_path / "doc"], max_file_bytes=100, stats=stats))
    assert {k: "".join(v) for k, v in got.items()} == {
        "alpha": "### file: alpha/__init__.py\nfrom .a import A\n### file: alpha/README\nread me\n"
                 "### file: alpha/a.py\nA = 2\n### file: alpha/z.py\nZ = 1\n### file: alpha/sub/m.py\nM = 3\n",
        "beta": "### file: beta/notes.md\n# notes\n",
        "six": "### file: six.py\nsix = 6\n",
    }
    assert (stats.packages_found, stats.files_kept, stats.files_duplicate, stats.files_too_large,
            stats.files_binary) == (3, 7, 1, 1, 1)
    assert stats.files_not_utf8 == [str(tmp_path / "site" / "alpha" / "latin.py")]
    assert f"input: skipping {str(tmp_path / 'site' / 'alpha' / 'latin.py')!r}: not UTF-8 (byte 0xe9 at offset 5)" \
        in caplog.text


# ----- prepare --group-by package ---------------------------------------------------------------------------------
WORDS = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do"]


def unique_word(i: int) -> str:
    return "uniqueword" + "abcdefghij"[i] + "xyz"


def package_sources(n_packages: int, files_per_package: int, seed: int = 0) -> dict:
    """Fake packages of Python-like files; package i repeats its own word `unique_word(i)` often."""
    rng = np.random.default_rng(seed)
    tree = {}
    for i in range(n_packages):
        for j in range(files_per_package):
            lines = [f"def f_{i}_{j}_{k}(x):\n    return {unique_word(i)} + "
                     + " ".join(WORDS[w] for w in rng.integers(0, len(WORDS), 6)) + "\n" for k in range(30)]
            tree[f"pkg{i:02d}/{'__init__' if j == 0 else f'mod{j}'}.py"] = "".join(lines)
    return tree


@pytest.fixture(scope="module")
def source_dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("src")
    make_tree(tmp / "site", package_sources(8, 4))
    out = tmp / "ds"
    r = subprocess.run([sys.executable, str(SCRIPT), "--group-by", "package", "--input", str(tmp / "site"),
                        "--out", str(out), "--doc-len", "256", "--vocab-size", "600", "--heldout-frac", "0.2",
                        "--no-roll", "--chunk-docs", "8", "--chunk-len", "128", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return tmp / "site", out, json.loads(r.stdout)


def test_package_documents_are_consecutive_slices_of_each_package(source_dataset):
    site, out, summary = source_dataset
    tok = load_tokenizer(out)
    assert isinstance(tok, BPETokenizer) and 300 < tok.vocab_size <= 600  # fewer when the corpus runs out of pairs
    info = dataset_info(out / "train.zarr")
    assert (info["tokenizer"], info["vocab_size"], info["bos_id"], info["doc_len"]) == (
        f"bpe-{tok.vocab_size}", tok.vocab_size, 0, 256)
    assert summary["tokenizer_file"] == "tokenizer.json" and (out / "tokenizer.json").is_file()
    texts = {name: "".join(parts) for name, parts in package_texts([site], max_file_bytes=1 << 20,
                                                                    stats=CorpusStats())}
    held = set(summary["heldout_packages"])
    assert held and held < set(texts) and len(held) <= 3
    # every stored document is one 256-token window of one package's token stream, at a multiple of 256
    windows = {}
    for name, text in texts.items():
        ids = np.asarray(tok.encode(text))
        assert tok.decode(ids) == text
        for k in range(len(ids) // 256):
            windows[ids[k * 256:(k + 1) * 256].tobytes()] = name
    found = {}
    for split in ("train", "heldout"):
        n = summary[f"{split}_docs"]
        rows = heldout_batch(out / f"{split}.zarr", 256, n)["targets"].numpy().astype(ids.dtype)
        found[split] = [windows[row.tobytes()] for row in rows]  # KeyError: not a window of any package
    assert set(found["heldout"]) == held and not held & set(found["train"])   # no package in both splits
    assert len(found["train"]) + len(found["heldout"]) == len(windows)         # every window once
    assert sorted(found["train"] + found["heldout"]) == sorted(windows.values())


def test_tokenizer_never_saw_the_heldout_packages(source_dataset):
    _, out, summary = source_dataset
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    for i in range(8):
        # a word repeated 120 times in its own package only: one token if the tokenizer was trained on that package
        token = "Ġ" + unique_word(i)          # byte-level BPE spells the leading space Ġ
        assert (token in vocab) == (f"pkg{i:02d}" not in summary["heldout_packages"]), token


def test_train_cli_runs_on_the_source_corpus(source_dataset, train_env, tmp_path):
    _, out, _ = source_dataset
    r = subprocess.run([sys.executable, str(REPO / "train.py"), "data=source_corpus", f"data.path={out}", "ctx=256",
                        "trainer.max_steps=2", "trainer.eval_every=2", "optim.warmup_steps=1", "data.docs_per_batch=4",
                        "data.eval_docs=4", "logger.wandb.mode=disabled", "trainer.num_threads=2", f"hydra.run.dir={tmp_path / 'run'}"],
                       env=train_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 2 and np.isfinite(records[-1]["best_context_loss"])
    assert records[-1]["icl_curve"][-1][1] == 256
    assert records[-1]["best_context_loss"] < np.log(600) + 0.5  # a 600-token vocabulary, barely trained
    # the run generates decoded text with the dataset's own tokenizer, offline (no tokenizer download exists here)
    g = subprocess.run([sys.executable, "-m", "longctx.generate", str(tmp_path / "run"), "--prompt", "def build(",
                        "--max-new-tokens", "6", "--temperature", "0", "--device", "cpu"],
                       env=dict(train_env, HF_HUB_OFFLINE="1"), cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert g.returncode == 0, g.stderr[-3000:]
    text, speed = g.stdout.rsplit("\n6 tokens in ", 1)  # the continuation as text, then the speed line
    assert text.strip() and not text.replace(",", " ").split()[0].isdigit(), g.stdout  # decoded text, not ids
    assert "tokens/s" in speed


def test_corpus_attention_sweep_runs_at_cpu_size(source_dataset, train_env, tmp_path):
    """`train.py -m experiment=corpus_attention` on a tiny source corpus (tiny model, ctx 256): its three points
    train, each on the corpus's own vocabulary."""
    _, out, summary = source_dataset
    r = subprocess.run([sys.executable, str(REPO / "train.py"), "-m", "experiment=corpus_attention", f"data.path={out}",
                        "model=tiny", "contexts.c8192=256", "docs_per_update.c8192=4", "window=32", "data.eval_docs=4",
                        "trainer.max_steps=2", "trainer.eval_every=2", "optim.warmup_steps=1", "trainer.compile=false",
                        "trainer.precision=auto", "logger.wandb.mode=disabled", "trainer.num_threads=2",
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       env=train_env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if (p / "metrics.jsonl").is_file())
    assert [name.split("_d64")[0] for name in runs] == ["gpt2_exp", "gpt2_power_p2", "gpt2_window32"], runs
    for name in runs:
        last = json.loads((tmp_path / "sweep" / name / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["step"] == 2 and last["icl_curve"][-1][1] == 256 and np.isfinite(last["best_context_loss"])


def test_package_mode_arguments(tmp_path, capsys):
    cli = load_cli()
    f = tmp_path / "file.py"
    f.write_text("x = 1\n")
    assert cli.main(["--group-by", "package", "--input", str(f), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"prepare_dataset: error: input: {str(f)!r} is not a folder (--group-by package reads source or "
        f"documentation trees)"]
    make_tree(tmp_path / "small", {"p/a.py": "x = 1\n"})
    assert cli.main(["--group-by", "package", "--input", str(tmp_path / "small"), "--out", str(tmp_path / "o"),
                     "--doc-len", "4096", "--quiet"]) == 2
    assert "no package of" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".tmp-*"))


def test_load_tokenizer_of_other_datasets(tmp_path):
    from longctx.data import ensure_icl_markov
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    make_tree(tmp_path / "c", {f"{i}.txt": "text " * 100 for i in range(4)})
    prepare_dataset(PrepareConfig(source=str(tmp_path / "c"), out=str(tmp_path / "b"), doc_len=64, tokenizer="bytes",
                                  heldout_docs=1, progress=False))
    assert isinstance(load_tokenizer(tmp_path / "b"), ByteTokenizer)
    assert isinstance(load_tokenizer(tmp_path / "b" / "train.zarr"), ByteTokenizer)
    root = ensure_icl_markov(tmp_path / "m", vocab=4, doc_len=16, n_train=8, n_heldout=4, progress=False)
    with pytest.raises(ValueError, match="is synthetic"):
        load_tokenizer(root)


def test_package_mode_with_bytes_and_exact_heldout_count(tmp_path):
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    make_tree(tmp_path / "site", package_sources(5, 2, seed=1))
    s = prepare_dataset(PrepareConfig(source=[str(tmp_path / "site")], out=str(tmp_path / "ds"), doc_len=512,
                                      group_by="package", tokenizer="bytes", heldout_docs=2, rolled=False,
                                      progress=False))
    assert (s["tokenizer"], s["heldout_docs"], len(s["heldout_packages"])) == ("bytes", 2, 1)
    assert "tokenizer_file" not in s and not (tmp_path / "ds" / "tokenizer.json").exists()
    (held,) = s["heldout_packages"]
    text = "".join(dict(package_texts([tmp_path / "site"], max_file_bytes=1 << 20, stats=CorpusStats()))[held])
    ids = np.frombuffer(text.encode(), dtype=np.uint8)
    rows = heldout_batch(tmp_path / "ds" / "heldout.zarr", 512, 2)["targets"].numpy()
    assert sorted(r.tobytes() for r in rows.astype(np.uint8)) == sorted(ids[k * 512:(k + 1) * 512].tobytes()
                                                                       for k in range(2))
    assert s["package_tokens"][held] == len(ids)
    with pytest.raises(ValueError, match=r"heldout_docs \(--heldout-docs\): 99 asked, but the heldout packages"):
        prepare_dataset(PrepareConfig(source=[str(tmp_path / "site")], out=str(tmp_path / "ds2"), doc_len=512,
                                      group_by="package", tokenizer="bytes", heldout_docs=99, progress=False))
    assert not (tmp_path / "ds2").exists()


def test_heldout_packages_without_a_document_are_refused(tmp_path):
    """A package of >= doc_len bytes can make fewer than doc_len BPE tokens: a heldout split of such packages only
    would be empty, and training needs one; refused naming the flag, nothing written."""
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    text = "def f(x):\n    return x + 1\n"
    make_tree(tmp_path / "site", {"big/__init__.py": text * 200, "small/__init__.py": text * 12})
    out = tmp_path / "ds"
    # heldout_frac 1% of the text: the smallest package, `small`; a vocabulary of at most 300 (fewer on this corpus)
    with pytest.raises(ValueError, match=r"^heldout_frac \(--heldout-frac\)=0\.01: the heldout packages \(small\) make "
                                         r"no document of 256 tokens \(tokenizer bpe-\d+\); raise --heldout-frac$"):
        prepare_dataset(PrepareConfig(source=[str(tmp_path / "site")], out=str(out), doc_len=256, group_by="package",
                                      vocab_size=300, heldout_frac=0.01, progress=False))
    assert not out.exists() and not list(tmp_path.glob(".tmp-*"))


def test_linked_packages_are_not_followed_and_the_refusal_says_so(tmp_path):
    """An input whose packages are symbolic links (a tree of links to site-packages): none is read, and the one-line
    refusal counts the links and says to give the folders they point to."""
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    make_tree(tmp_path / "real", package_sources(3, 2, seed=1))
    (tmp_path / "site").mkdir()
    for pkg in sorted((tmp_path / "real").iterdir()):
        (tmp_path / "site" / pkg.name).symlink_to(pkg)
    with pytest.raises(ValueError) as caught:
        prepare_dataset(PrepareConfig(source=[str(tmp_path / "site")], out=str(tmp_path / "ds"), doc_len=512,
                                      group_by="package", tokenizer="bytes", heldout_docs=1, progress=False))
    assert str(caught.value) == (f"input: no package of {tmp_path / 'site'} holds >= doc_len=512 bytes of text (0 "
                                 f"packages with text); 3 symbolic links in the inputs, never followed: give the "
                                 f"folders they point to as inputs")
    assert not (tmp_path / "ds").exists()
