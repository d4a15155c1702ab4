"""Data that never loses a user's files and never lies: what --overwrite may replace, missing and damaged chunks,
token ids beyond the model's vocabulary, bad arguments, non-UTF-8 text, temporary folders of killed writers."""
import importlib.util
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import zarr
from omegaconf import OmegaConf

from lc64_fixtures import random_tokens, write_v2_like_zarr2, write_v3
from longctx.data import LongCrawl64, check_vocab, ensure_icl_markov, heldout_batch
from longctx.data._array import ChunkError
from longctx.data._tmpdir import LOCK_NAME
from longctx.train.data import DataSplits, build_heldout, resolve_splits

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_dataset.py"
L = 64


def load_cli():
    spec = importlib.util.spec_from_file_location("prepare_dataset_cli", SCRIPT)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(12):
        (d / f"{i:02d}.txt").write_text(f"document {i} " + "words and more words " * (4 + i), encoding="utf-8")
    return d


def run(cli, capsys, *argv):
    code = cli.main([*map(str, argv), "--tokenizer", "bytes", "--doc-len", str(L), "--heldout-docs", "2", "--quiet"])
    return code, capsys.readouterr()


# ----- --overwrite -------------------------------------------------------------------------------------------
def test_overwrite_never_replaces_a_folder_of_other_files(corpus, tmp_path, capsys):
    mine = tmp_path / "thesis"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.md").write_text("my notes")
    (mine / "sub" / "thesis.tex").write_text("\\documentclass{article}")
    before = snapshot(mine)
    code, io = run(load_cli(), capsys, "--input", corpus, "--out", mine, "--overwrite")
    assert code == 2
    assert io.err.strip().splitlines() == [
        f"prepare_dataset: error: out: {str(mine)!r} is not a dataset written by prepare_dataset (no prepare.json of "
        f"its own); --overwrite replaces only those: choose another --out"]
    assert snapshot(mine) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("where", ["equal", "inside", "around"])
def test_overwrite_never_touches_the_input(corpus, tmp_path, capsys, where):
    out = {"equal": corpus, "inside": corpus / "ds", "around": tmp_path}[where]
    word = {"equal": "is the input", "inside": "lies inside the input", "around": "contains the input"}[where]
    before = snapshot(corpus)
    code, io = run(load_cli(), capsys, "--input", corpus, "--out", out, "--overwrite")
    assert code == 2
    assert io.err.strip().splitlines() == [
        f"prepare_dataset: error: out: {str(out)!r} {word} {str(corpus)!r}; choose a folder outside the input"]
    assert snapshot(corpus) == before
    assert not (corpus / "ds").exists()


def test_overwrite_replaces_its_own_dataset_only_while_it_holds_nothing_else(corpus, tmp_path, capsys):
    cli = load_cli()
    out = tmp_path / "ds"
    assert run(cli, capsys, "--input", corpus, "--out", out)[0] == 0
    manifest = json.loads((out / "prepare.json").read_text())
    assert manifest["written_by"] == "longctx.data.prepare"
    assert manifest["files"] == ["heldout.zarr", "prepare.json", "train.zarr"]
    assert run(cli, capsys, "--input", corpus, "--out", out, "--overwrite", "--seed", "3")[0] == 0
    assert json.loads((out / "prepare.json").read_text())["params"]["seed"] == 3
    (out / "results.csv").write_text("step,loss\n")
    code, io = run(cli, capsys, "--input", corpus, "--out", out, "--overwrite")
    assert code == 2 and "holds files prepare_dataset did not write (results.csv)" in io.err
    assert (out / "results.csv").exists() and (out / "train.zarr").exists()


@pytest.mark.parametrize("fmt", ["3", "2"])
@pytest.mark.parametrize("added", ["notes.txt", "train.zarr/notes.txt", "heldout.zarr/sub/results.csv",
                                   "train.zarr/zarr.json.bak"])
def test_overwrite_never_removes_a_file_added_inside_the_dataset(corpus, tmp_path, capsys, fmt, added):
    """A file the user put anywhere in the dataset folder, inside a split's array included, survives --overwrite:
    the run is refused naming it, and a run after the file is moved out replaces the dataset."""
    cli = load_cli()
    out = tmp_path / "ds"
    assert run(cli, capsys, "--input", corpus, "--out", out, "--zarr-format", fmt)[0] == 0
    (out / added).parent.mkdir(parents=True, exist_ok=True)
    (out / added).write_text("the user's own")
    before = snapshot(out)
    code, io = run(cli, capsys, "--input", corpus, "--out", out, "--zarr-format", fmt, "--overwrite", "--seed", "3")
    assert code == 2
    assert io.err.strip().splitlines() == [
        f"prepare_dataset: error: out: {str(out)!r} holds files prepare_dataset did not write ({added}); refusing "
        f"to replace it: move them out of it or choose another --out"]
    assert snapshot(out) == before
    (out / added).unlink()
    assert run(cli, capsys, "--input", corpus, "--out", out, "--zarr-format", fmt, "--overwrite", "--seed", "3")[0] == 0
    assert json.loads((out / "prepare.json").read_text())["params"]["seed"] == 3


def test_overwrite_never_removes_a_link_inside_a_split(corpus, tmp_path, capsys):
    cli = load_cli()
    out = tmp_path / "ds"
    assert run(cli, capsys, "--input", corpus, "--out", out)[0] == 0
    (out / "train.zarr" / "c" / "mine").symlink_to(corpus, target_is_directory=True)
    code, io = run(cli, capsys, "--input", corpus, "--out", out, "--overwrite")
    assert code == 2 and "did not write (train.zarr/c/mine)" in io.err
    assert (out / "train.zarr" / "c" / "mine").is_symlink()


# ----- bad arguments: one line, exit 2, nothing written ----------------------------------------------------------
@pytest.mark.parametrize("extra,message", [
    (["--chunk-len", "0"], "chunk_len (--chunk-len): must be an integer >= 1, got 0"),
    (["--chunk-docs", "0"], "chunk_docs (--chunk-docs): must be an integer >= 1, got 0"),
    (["--heldout-docs", "-1"], "heldout_docs (--heldout-docs): must be an integer >= 1 (training needs documents "
                               "in both train.zarr and heldout.zarr), got -1"),
    (["--heldout-docs", "0"], "heldout_docs (--heldout-docs): must be an integer >= 1 (training needs documents "
                              "in both train.zarr and heldout.zarr), got 0"),
    (["--max-docs", "0"], "max_docs (--max-docs): must be an integer >= 1, got 0"),
    (["--heldout-frac", "1.5"], "heldout_frac (--heldout-frac): must be in (0, 1) (training needs documents in both "
                                "train.zarr and heldout.zarr), got 1.5"),
    (["--heldout-frac", "0"], "heldout_frac (--heldout-frac): must be in (0, 1) (training needs documents in both "
                              "train.zarr and heldout.zarr), got 0.0"),
    (["--vocab-size", "100"], "vocab_size (--vocab-size): must be an integer in [258, 65536], got 100"),
    (["--tokenizer", "bpe"], "tokenizer=bpe: needs --group-by package"),
])
def test_bad_argument_is_one_line_before_any_work(corpus, tmp_path, capsys, monkeypatch, extra, message):
    from longctx.data import prepare

    monkeypatch.setattr(prepare, "_prepare_files", lambda *a: pytest.fail("work started"))
    out = tmp_path / "o"
    argv = ["--input", str(corpus), "--out", str(out), "--tokenizer", "bytes", "--doc-len", str(L), "--quiet", *extra]
    assert load_cli().main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prepare_dataset: error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


@pytest.mark.parametrize("extra,given,held", [(["--heldout-frac", "0.99"], "heldout_frac (--heldout-frac)=0.99", 12),
                                              (["--heldout-docs", "12"], "heldout_docs (--heldout-docs)=12", 12),
                                              (["--heldout-docs", "50"], "heldout_docs (--heldout-docs)=50", 50)])
def test_heldout_that_leaves_no_training_document_is_one_line(corpus, tmp_path, capsys, extra, given, held):
    """Whether the train split would be empty needs the count of documents kept (all 12 of the corpus): refused
    naming the flag, nothing written."""
    out = tmp_path / "o"
    argv = ["--input", str(corpus), "--out", str(out), "--tokenizer", "bytes", "--doc-len", str(L), "--quiet", *extra]
    assert load_cli().main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"prepare_dataset: error: {given} holds out {held} of the 12 documents kept, leaving none to train on; lower "
        f"it or add documents"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_smallest_heldout_fraction_gives_a_dataset_training_can_use(corpus, tmp_path, capsys, compose):
    out = tmp_path / "ds"
    argv = ["--input", str(corpus), "--out", str(out), "--tokenizer", "bytes", "--doc-len", str(L), "--quiet",
            "--heldout-frac", "0.001"]
    assert load_cli().main(argv) == 0
    splits = resolve_splits(compose("data=longcrawl64", f"data.path={out}").data, L)
    heldout = build_heldout(splits, OmegaConf.create({"eval_docs": 4}), L, 257)
    assert heldout["targets"].shape == (1, L)  # round(0.001 * 12) = 0, raised to one document


def test_out_that_is_a_file_fails_before_any_work(corpus, tmp_path, capsys, monkeypatch):
    from longctx.data import prepare

    monkeypatch.setattr(prepare, "_prepare_files", lambda *a: pytest.fail("work started"))
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    for out, msg in ((f, f"out: {str(f)!r} exists and is not a folder"),
                     (f / "ds", f"out: {str(f)!r} is a file, so {str(f / 'ds')!r} cannot be created")):
        code, io = run(load_cli(), capsys, "--input", corpus, "--out", out, "--overwrite")
        assert code == 2 and io.err.strip().splitlines() == [f"prepare_dataset: error: {msg}" +
                                                             ("; choose a folder path" if out == f else "")]
    assert f.read_text() == "keep me"


def test_non_utf8_file_is_named_and_skipped(corpus, tmp_path, capsys):
    bad = corpus / "05.txt"
    bad.write_bytes(b"latin-1 text: caf\xe9 " * 10)
    out = tmp_path / "ds"
    code, io = run(load_cli(), capsys, "--input", corpus, "--out", out)
    assert code == 0
    warnings = [line for line in io.err.splitlines() if "05.txt" in line]
    assert warnings == [f"prepare_dataset: warning: input: skipping {str(bad)!r}: not UTF-8 (byte 0xe9 at offset 17)"]
    summary = json.loads(io.out)
    assert summary["files_not_utf8"] == [str(bad)] and summary["documents_read"] == 11


# ----- chunks: missing and damaged ------------------------------------------------------------------------------
@pytest.fixture(params=["v3", "v2"])
def split(request, tmp_path):
    data = random_tokens(32, 48, vocab=1000)
    writer = write_v3 if request.param == "v3" else write_v2_like_zarr2
    path = writer(tmp_path / "train.zarr", data, (8, 16), attrs={"bos_id": 1000, "vocab_size": 1001})
    key = "c/2/1" if request.param == "v3" else "2.1"   # documents 16-23, positions 16-31
    return path, data, key


def test_missing_chunk_is_refused_naming_it(split):
    path, _, key = split
    (path / key).unlink()
    msg = rf"data.path: chunk '{key}' of '{path}' is missing: '{path / key}' does not exist"
    with pytest.raises(ChunkError, match=msg):
        LongCrawl64(path, 16, 4)                           # the reader reads every chunk: refused at once
    with pytest.raises(ChunkError, match=msg):
        heldout_batch(path, 32, 20)                        # documents 0-19 x positions 0-31 include it
    assert heldout_batch(path, 16, 20)["targets"].shape == (20, 16)  # a region without it still reads
    with pytest.raises(ChunkError, match=msg):
        check_vocab(path, 1001)


def test_chunk_missing_after_open_is_refused_at_read(split):
    path, _, key = split
    loader = LongCrawl64(path, 16, 4)
    (path / key).unlink()
    with pytest.raises(ChunkError, match=f"chunk '{key}'.* is missing"):
        for _ in zip(range(len(loader)), iter(loader)):
            pass
    loader.close()


def test_truncated_chunk_names_chunk_and_file(split):
    path, _, key = split
    raw = (path / key).read_bytes()
    (path / key).write_bytes(raw[:len(raw) // 2])
    loader = LongCrawl64(path, 16, 4)
    with pytest.raises(ChunkError, match=rf"data.path: chunk '{key}' of .* cannot be decoded \(.*\); file "
                                         rf"'{path / key}' is damaged or truncated"):
        for _ in zip(range(len(loader)), iter(loader)):
            pass
    loader.close()
    with pytest.raises(ChunkError, match=f"chunk '{key}'"):
        heldout_batch(path, 48, 32)


def test_writers_write_every_chunk(tmp_path):
    """Zarr 3 skips chunks of fill value only: a dataset of ours must hold every chunk, or missing means damaged."""
    root = ensure_icl_markov(tmp_path, vocab=2, alpha=1.0, doc_len=16, n_train=8, n_heldout=4, progress=False)
    arr = zarr.open_array(str(root / "train.zarr"), mode="r")
    n_chunks = int(np.prod([-(-s // c) for s, c in zip(arr.shape, arr.chunks)]))
    assert len(list((root / "train.zarr" / "c").rglob("*"))) >= n_chunks
    zeros = zarr.create_array(str(tmp_path / "z.zarr"), shape=(4, 4), chunks=(2, 2), dtype="uint16",
                              config={"write_empty_chunks": True})
    zeros[:] = 0
    LongCrawl64(tmp_path / "z.zarr", 4, 2).close()  # all-zero chunks present: accepted


# ----- token ids against the model's vocabulary -------------------------------------------------------------------
def test_ids_above_recorded_max_token_id_are_found(tmp_path):
    data = random_tokens(64, 32, vocab=100)
    data[60, 30] = 700                                      # the attribute says 99: it lies
    path = write_v3(tmp_path / "train.zarr", data, (8, 16), attrs={"bos_id": 100, "max_token_id": 99})
    with pytest.raises(ValueError, match=r"data.path: token id 700 at document 60, position 30 of .* >= model "
                                         r"vocab_size=512; the array records max_token_id=99, which is wrong"):
        check_vocab(path, 512)
    # a sample that misses it: the reader's own check stops at the block instead of an index error mid-run
    assert check_vocab(path, 512, max_scan_tokens=128) == 99
    loader = LongCrawl64(path, 16, 8, vocab_limit=512)
    with pytest.raises(ValueError, match=r"token id 700 at document 60, position 30 .* >= model vocab_size=512"):
        for _ in zip(range(len(loader)), iter(loader)):
            pass
    loader.close()


def test_heldout_bos_beyond_the_vocabulary_is_refused(tmp_path):
    train = write_v3(tmp_path / "train.zarr", random_tokens(8, 32, vocab=50), (8, 16),
                     attrs={"bos_id": 50, "vocab_size": 51})
    heldout = write_v3(tmp_path / "heldout.zarr", random_tokens(8, 32, vocab=50), (8, 16),
                       attrs={"bos_id": 60000, "vocab_size": 51})
    splits = DataSplits(train_path=train, heldout_path=heldout, info={"vocab_size": 51})
    cfg = OmegaConf.create({"eval_docs": 4})
    with pytest.raises(ValueError, match=r"^data.heldout_split: bos_id=60000 of .*heldout.zarr >= model "
                                         r"vocab_size=51, which comes from .*train.zarr's vocab_size=51$"):
        build_heldout(splits, cfg, 16, 51)


def test_longcrawl64_without_path_is_one_line(compose):
    cfg = compose("data=longcrawl64")
    with pytest.raises(ValueError, match="^data.path: not set; point it at the folder holding train.zarr and "
                                         "heldout.zarr$"):
        resolve_splits(cfg.data, 64)


@pytest.mark.parametrize("writer", [write_v3, write_v2_like_zarr2])
def test_data_path_at_a_split_names_the_dataset_folder(compose, tmp_path, writer):
    ds = tmp_path / "ds"
    for name in ("train.zarr", "heldout.zarr"):
        writer(ds / name, random_tokens(8, 32, vocab=50), (8, 16), attrs={"bos_id": 50, "vocab_size": 51})
    for split in ("train.zarr", "heldout.zarr"):
        cfg = compose("data=longcrawl64", f"data.path={ds / split}")
        with pytest.raises(ValueError) as e:
            resolve_splits(cfg.data, 16)
        assert str(e.value) == (f"data.path={str(ds / split)!r}: is one split's zarr array, not a dataset folder; "
                                f"give the folder holding train.zarr and heldout.zarr: data.path={str(ds)!r}")
    splits = resolve_splits(compose("data=longcrawl64", f"data.path={ds}").data, 16)
    assert (splits.train_path, splits.heldout_path, splits.info["num_docs"]) == (ds / "train.zarr",
                                                                                ds / "heldout.zarr", 8)
    missing = tmp_path / "nope"
    (missing / "train.zarr").mkdir(parents=True)  # a folder without a dataset: still "does not exist"
    with pytest.raises(FileNotFoundError, match=f"^data.path: {str(missing / 'train.zarr' / 'train.zarr')!r} does"):
        resolve_splits(compose("data=longcrawl64", f"data.path={missing / 'train.zarr'}").data, 16)


# ----- temporary folders of killed writers -------------------------------------------------------------------------
def killed_writer(parent: Path, name: str) -> Path:
    """A writer killed with SIGKILL inside `writing_dir` (a forked child: no clean-up code of ours can run)."""
    from longctx.data._tmpdir import writing_dir

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            with writing_dir(parent, name) as tmp:
                (tmp / "kept.tokens").write_bytes(b"x" * 1000)
                os.write(w, str(tmp).encode())
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.close(w)
    tmp = Path(os.read(r, 4096).decode())
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert tmp.is_dir() and (tmp / LOCK_NAME).exists()
    return tmp


def test_killed_prepare_leftovers_are_cleaned_on_the_next_start(corpus, tmp_path, capsys):
    left = killed_writer(tmp_path, "ds")
    foreign = tmp_path / ".tmp-someone-else"    # no lock file: not ours, left alone
    foreign.mkdir()
    code, io = run(load_cli(), capsys, "--input", corpus, "--out", tmp_path / "ds")
    assert code == 0 and not left.exists() and foreign.exists()
    assert f"removed {str(left)!r}, the temporary folder of an interrupted dataset write" in io.err


def test_killed_generation_leftovers_are_cleaned_but_live_writers_are_not(tmp_path):
    from longctx.data._tmpdir import writing_dir

    with writing_dir(tmp_path, "live") as live:                # a writer still running holds its lock
        left = killed_writer(tmp_path, "icl_markov-k4")        # its start cleaned nothing of the live writer
        assert live.exists()
        ensure_icl_markov(tmp_path, vocab=4, alpha=1.0, doc_len=16, n_train=8, n_heldout=4, progress=False)
        assert not left.exists() and live.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_heldout_docs_given_takes_a_zero_heldout_frac(tmp_path):
    """--heldout-docs decides the heldout split where given (file inputs), so --heldout-frac 0 beside it is valid;
    without it, 0 leaves no heldout document and is refused."""
    from longctx.data.prepare import PrepareConfig, check_config

    (tmp_path / "x.txt").write_text("some text\n")
    check_config(PrepareConfig(source=str(tmp_path / "x.txt"), out=str(tmp_path / "ds"), heldout_docs=3,
                               heldout_frac=0.0))
    with pytest.raises(ValueError, match=r"heldout_frac \(--heldout-frac\): must be in \(0, 1\)"):
        check_config(PrepareConfig(source=str(tmp_path / "x.txt"), out=str(tmp_path / "ds"), heldout_frac=0.0))


@pytest.mark.parametrize("attr,name", [("tokenizer_file", "/etc/passwd"), ("tokenizer_file", "../outside.json"),
                                       ("bayes_nll", "../../elsewhere.zarr"), ("bayes_nll", "/tmp")])
def test_a_dataset_attribute_never_names_a_file_outside_the_dataset(tmp_path, attr, name):
    """tokenizer_file (which a run copies into its folder) and bayes_nll name the dataset's own files: a path
    elsewhere is one error naming the attribute, never read."""
    from longctx.data._array import bayes_path, open_tokens
    from longctx.data.tokenizer import load_tokenizer, tokenizer_file_of

    (tmp_path / "outside.json").write_text("{}")
    root = tmp_path / "ds"
    root.mkdir()
    split = write_v3(root / "train.zarr", random_tokens(4, 64, 8), (4, 64), attrs={"bos_id": 0, attr: name})
    with pytest.raises(ValueError, match=f"attribute {attr}={name!r} is not a file name beside"):
        tokenizer_file_of(split) if attr == "tokenizer_file" else bayes_path(open_tokens(split))
    if attr == "tokenizer_file":
        with pytest.raises(ValueError, match=f"attribute {attr}="):
            load_tokenizer(root)


def test_running_the_prepare_library_as_a_command_names_the_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "longctx.data.prepare", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == ("longctx.data.prepare is the library behind scripts/prepare_dataset.py; run: python "
                                  "scripts/prepare_dataset.py --help")


@pytest.mark.parametrize("attrs,named", [({"bos_id": "x"}, "bos_id='x'"), ({"vocab_size": "abc"}, "vocab_size='abc'"),
                                         ({"vocab_size": -5}, "vocab_size=-5"), ({"bos_id": 1.5}, "bos_id=1.5")])
def test_a_malformed_integer_attribute_is_named(tmp_path, attrs, named):
    from longctx.data._array import info, open_tokens

    split = write_v3(tmp_path / "train.zarr", random_tokens(4, 64, 8), (4, 64), attrs=attrs)
    with pytest.raises(ValueError, match=f"train.zarr.*: attribute {named} is not an integer"):
        info(open_tokens(split))


def test_a_cache_dir_that_cannot_hold_generated_data_is_one_line_naming_the_key(tmp_path):
    from longctx.data._tmpdir import generate_once

    a_file = tmp_path / "a_file"
    a_file.write_text("")

    def never(folder, params):
        raise AssertionError("nothing is generated")
    for where in (a_file, a_file / "below"):
        with pytest.raises(ValueError, match=rf"data\.cache_dir='{where}' .*: cannot hold the generated data"):
            generate_once(where, "x", {}, never)
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):   # root writes anywhere: the permission case cannot be made here
        return
    with pytest.raises(ValueError, match="cannot hold the generated data"):
        generate_once(read_only, "x", {}, never)
