"""A run on a prepared corpus launched with a relative data.path works from any folder: its config records every
path absolute, it keeps its dataset's tokenizer file, generate decodes text with the tokenizer the run used (its
dataset moved away included), a missing dataset is named by the path the run recorded, and a relaunch naming the
same folder another way is not a change of config."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from omegaconf import OmegaConf

from longctx.data.tokenizer import BPETokenizer, ByteTokenizer
from longctx.evaluate import main as evaluate_main
from longctx.generate import main as generate_main
from longctx.train import checkpoint as ckpt
from longctx.train.paths import resolve_run_paths
from longctx.train.trainer import Trainer

DOC_LEN, N_TRAIN, N_HELDOUT = 128, 8, 4
TRAIN = ["data=source_corpus", "trainer.max_steps=2", "trainer.eval_every=2", "logger.wandb.mode=disabled",
         "data.docs_per_batch=4", "data.eval_docs=4", "ctx=64", "trainer.num_threads=2", "optim.warmup_steps=1"]
TEXT = "".join(f"def f{i}(x):\n    return x * {i} + {i * i % 97}\n" for i in range(600))


def make_corpus(root: Path, kind: str) -> None:
    """A dataset in the layout scripts/prepare_dataset.py writes: BOS (the tokenizer's EOT) then text tokens, with
    the attributes that name its tokenizer (a BPE's file beside the splits)."""
    root.mkdir(parents=True)
    if kind == "bpe":
        tok = BPETokenizer.train([TEXT], 300)
        tok.save(root / "tokenizer.json")
        attrs = {"tokenizer": tok.name, "tokenizer_file": "tokenizer.json"}
    else:
        tok, attrs = ByteTokenizer(), {"tokenizer": "bytes"}
    ids = tok.encode(TEXT)
    rows = np.array([[tok.eot_id, *ids[i * (DOC_LEN - 1):(i + 1) * (DOC_LEN - 1)]] for i in range(N_TRAIN + N_HELDOUT)],
                    dtype=np.uint16)
    attrs |= {"bos_id": tok.eot_id, "vocab_size": tok.vocab_size, "max_token_id": int(rows.max())}
    for split, part in (("train.zarr", rows[:N_TRAIN]), ("heldout.zarr", rows[N_TRAIN:])):
        arr = zarr.create_array(str(root / split), shape=part.shape, chunks=(4, DOC_LEN), dtype="uint16",
                                attributes=attrs)
        arr[:] = part


@pytest.fixture(scope="module")
def launched(tmp_path_factory, train_run):
    """kind -> (launch folder, run folder): one run per tokenizer, launched from its folder with data.path relative."""
    runs = {}
    before = os.getcwd()
    for kind in ("bpe", "bytes"):
        work = tmp_path_factory.mktemp(f"launch_{kind}")
        make_corpus(work / "data" / "corpus", kind)
        os.chdir(work)
        try:
            train_run(work / "run", [*TRAIN, "data.path=data/corpus"])
        finally:
            os.chdir(before)
        runs[kind] = work, work / "run"
    return runs


def test_the_run_records_its_paths_absolute(launched, data_cache):
    work, run = launched["bpe"]
    config = OmegaConf.load(run / "config.yaml")
    assert config.data.path == str(work / "data" / "corpus")
    assert config.cache_dir == str(data_cache)
    saved = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])["config"]
    assert saved["data"]["path"] == str(work / "data" / "corpus")   # load_run reads this one
    assert (run / "tokenizer.json").read_bytes() == (work / "data" / "corpus" / "tokenizer.json").read_bytes()


def test_resolve_run_paths_of_a_saved_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = {"data": {"path": "data/corpus", "cache_dir": "~/cache"}, "cache_dir": "/abs",
             "trainer": {"init_from": None}}
    assert resolve_run_paths(saved) == {"data": {"path": str(tmp_path / "data" / "corpus"),
                                                 "cache_dir": str(Path.home() / "cache")},
                                        "cache_dir": "/abs", "trainer": {"init_from": None}}


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_generate_from_another_folder_with_the_runs_tokenizer(launched, kind, tmp_path, monkeypatch, capsys):
    """From another folder, then with the dataset moved away: the prompt is encoded by the tokenizer the run used
    (a BPE from the copy in the run folder, bytes by the name it recorded), never GPT-2's."""
    work, run = launched[kind]
    monkeypatch.chdir(tmp_path)
    args = [str(run), "--prompt", "def f", "--max-new-tokens", "3", "--temperature", "0", "--device", "cpu"]
    tok = BPETokenizer.from_file(work / "data" / "corpus" / "tokenizer.json") if kind == "bpe" else ByteTokenizer()
    prompt = f"prompt of {1 + len(tok.encode('def f'))} tokens"   # BOS and the text's
    assert generate_main(args) == 0, capsys.readouterr().err
    *text, speed = capsys.readouterr().out.splitlines()
    assert prompt in speed, speed
    shutil.move(work / "data", work / "moved")
    try:
        assert generate_main(args) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.splitlines()[:-1] == text   # the same greedy continuation, decoded alike
    finally:
        shutil.move(work / "moved", work / "data")


def test_evaluate_from_another_folder_and_a_missing_dataset_named(launched, tmp_path, monkeypatch, capsys):
    work, run = launched["bpe"]
    monkeypatch.chdir(tmp_path)
    assert evaluate_main([str(run), "--docs", "2", "--device", "cpu", "--out", str(tmp_path / "a.json")]) == 0
    capsys.readouterr()
    shutil.move(work / "data", work / "moved")
    try:
        assert evaluate_main([str(run), "--docs", "2", "--device", "cpu", "--out", str(tmp_path / "b.json")]) == 2
    finally:
        shutil.move(work / "moved", work / "data")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: data.path={str(work / 'data' / 'corpus')!r}"), err


def test_a_damaged_tokenizer_file_is_one_line_naming_it(launched, tmp_path, capsys):
    _, run = launched["bpe"]
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    text = (copy / "tokenizer.json").read_text()
    (copy / "tokenizer.json").write_text(text[:len(text) // 2])   # cut short
    assert generate_main([str(copy), "--prompt", "def f", "--max-new-tokens", "2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {copy / 'tokenizer.json'}: not a readable tokenizer file"), err
    with pytest.raises(ValueError, match="not a readable tokenizer file"):
        BPETokenizer.from_file(copy / "tokenizer.json")


def test_resume_naming_the_data_folder_another_way_is_no_change(launched, compose, capsys):
    """Launched with data.path=data/corpus (relative); resumed from elsewhere with the absolute path: the same
    config, so no data.path change is reported, and the run continues."""
    work, run = launched["bpe"]
    copy = work / "resumed"
    shutil.copytree(run, copy)
    capsys.readouterr()
    Trainer(compose(*TRAIN, f"data.path={work / 'data' / 'corpus'}", "trainer.max_steps=4", "trainer.resume=true",
                    f"run_dir={copy}")).fit()
    out = capsys.readouterr().out
    assert "resuming from" in out and "data.path" not in out, out
    assert ckpt.latest_checkpoint(copy)[0] == 4


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_retrieval_prompts_are_the_runs_own_text(launched, tmp_path, kind):
    """Passkey prompts on a prepared corpus are made of its tokenizer's words: the record holds the marker, digits
    and filler decoded as the text the docs describe."""
    import json

    from longctx.eval.retrieval import FILLER_TEXT, MARKER_TEXT

    _, run = launched[kind]
    out = tmp_path / "passkey.json"
    assert evaluate_main([str(run), "--task", "passkey", "--contexts", "64", "--depths", "0,1", "--trials", "2",
                          "--device", "cpu", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["marker_text"] == MARKER_TEXT and record["filler_text"] == FILLER_TEXT
    assert record["digits_text"] == [str(i) for i in range(10)]


def test_the_kept_tokenizer_is_never_written_through_a_link(tmp_path, train_run):
    """A run folder whose tokenizer.json is a link (to a file the run must not touch) is refused before anything is
    written; the copy is otherwise written under a fresh name and renamed into place."""
    make_corpus(tmp_path / "corpus", "bpe")
    precious = tmp_path / "precious.json"
    precious.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.json").symlink_to(precious)
    with pytest.raises(ValueError, match="tokenizer.json is a symbolic link"):
        train_run(run, [*TRAIN, f"data.path={tmp_path / 'corpus'}"])
    assert precious.read_text() == "keep me\n" and sorted(p.name for p in run.iterdir()) == ["tokenizer.json"]


@pytest.mark.parametrize("name,kind", [("checkpoints", "file"), ("eval", "file"), ("metrics.jsonl", "folder"),
                                       ("train.log", "folder")])
def test_an_entry_of_the_wrong_kind_is_refused_before_training(compose, tiny, tmp_path, name, kind):
    """A file where the run writes a folder (checkpoints/, eval/) or a folder where it writes a file: one line naming
    it before any step, not a traceback at the first evaluation or checkpoint."""
    from longctx.train.trainer import Trainer

    run = tmp_path / "run"
    run.mkdir()
    (run / name).mkdir() if kind == "folder" else (run / name).write_text("mine\n")
    what = "is a folder, where the run writes a file" if kind == "folder" else "is not a folder, where the run writes"
    with pytest.raises(ValueError, match=f"{run / name} {what}"):
        Trainer(compose(*tiny, f"run_dir={run}"))
    assert sorted(p.name for p in run.iterdir()) == [name]
