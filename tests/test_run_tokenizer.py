"""A run's text goes through the tokenizer it was trained with, never silently through another: generate and the
retrieval tasks take the tokenizer the run recorded before its dataset's current one (a dataset re-prepared since is
said in one warning line naming both, or refused where the run's own cannot be loaded); a dataset whose splits hold
ids of different tokenizers is refused where its splits are opened (training, evaluate); evaluate refuses data of
another tokenizer than the run's. Tiny GPT-2 runs trained 2 steps on prepared text corpora (CPU, seconds)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import longctx.generate as generate_cli
from longctx.data.prepare import PrepareConfig, prepare_dataset
from longctx.data.tokenizer import BPETokenizer, ByteTokenizer
from longctx.evaluate import main as evaluate_main, text_codec_of
from longctx.runs import load_run
from longctx.train.data import resolve_splits

WORDS = "alpha beta gamma delta river stone light shadow number seven green sky".split()
TRAIN = ["data=source_corpus", "ctx=128", "trainer.max_steps=2", "trainer.eval_every=2", "optim.warmup_steps=1",
         "data.docs_per_batch=4", "data.eval_docs=4", "logger.wandb.mode=disabled", "trainer.num_threads=2"]
PROMPT = "zq!"  # no BPE merge applies: its BPE ids are small enough for a byte model to take without complaint


def write_packages(root: Path, words: list[str]) -> Path:
    rng = np.random.default_rng(0)
    for i in range(3):
        (root / f"pkg{i}").mkdir(parents=True)
        (root / f"pkg{i}" / "__init__.py").write_text("".join(
            f"def f_{i}_{k}(x):\n    return " + " ".join(words[w] for w in rng.integers(0, len(words), 6)) + "\n"
            for k in range(60)))
    return root


def prepare(source: Path, out: Path, tokenizer: str, vocab_size: int = 300, heldout_docs: int = 6) -> Path:
    extra = {"vocab_size": vocab_size} if tokenizer == "bpe" else {}
    prepare_dataset(PrepareConfig(source=[str(source)], out=str(out), doc_len=256, group_by="package",
                                  tokenizer=tokenizer, heldout_docs=heldout_docs, rolled=False, progress=False,
                                  **extra))
    return out


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A text corpus prepared with the byte tokenizer and with a BPE of 300 ids; a BPE of 300 ids of other text."""
    root = tmp_path_factory.mktemp("corpora")
    site = write_packages(root / "site", WORDS)
    other = write_packages(root / "other_site", [w.upper() + "_x" for w in WORDS])
    return {"bytes": prepare(site, root / "bytes", "bytes"), "bpe": prepare(site, root / "bpe", "bpe"),
            "bpe_other": prepare(other, root / "bpe_other", "bpe")}


def retokenized_run(root: Path, train_run, corpora, trained: str, now: str) -> Path:
    """A run trained on its dataset prepared with `trained`, whose dataset was then prepared again with `now`."""
    shutil.copytree(corpora[trained], root / "ds")
    run = train_run(root / "run", [*TRAIN, f"data.path={root / 'ds'}"])
    shutil.rmtree(root / "ds")
    shutil.copytree(corpora[now], root / "ds")
    return run


@pytest.fixture(scope="module")
def bytes_run(tmp_path_factory, train_run, corpora):
    return retokenized_run(tmp_path_factory.mktemp("bytes_run"), train_run, corpora, "bytes", "bpe")


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, train_run, corpora):
    return retokenized_run(tmp_path_factory.mktemp("bpe_run"), train_run, corpora, "bpe", "bytes")


def stderr_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


# -- generate and the retrieval tasks: the run's recorded tokenizer first --------------------------------------------

def test_generate_encodes_and_decodes_with_the_runs_tokenizer(bytes_run, capsys):
    """Trained on bytes, its dataset since prepared with a BPE: the prompt is the UTF-8 bytes, the continuation is
    decoded as bytes, and one warning names both tokenizers."""
    from longctx.train.console import setup_logging

    setup_logging()
    res = generate_cli.generate_from_run(bytes_run, 6, prompt=PROMPT, temperature=0, device="cpu")
    assert res["prompt_ids"] == [256, *PROMPT.encode("utf-8")]   # BOS first, as the run's documents
    assert res["text"] == bytes(i for i in res["ids"] if i < 256).decode("utf-8", errors="replace")
    data = bytes_run.parent / "ds"
    assert stderr_lines(capsys) == [
        f"warning: data.path={str(data)!r} now holds ids of tokenizer bpe-300 (bos_id=0, {data / 'tokenizer.json'}); "
        f"the run was trained on ids of tokenizer bytes (bos_id=256), as its data_identity.json records: using the "
        f"run's tokenizer"]


def test_retrieval_prompts_use_the_runs_tokenizer(bytes_run):
    _, cfg = load_run(bytes_run, device="cpu")
    encode, decode = text_codec_of(cfg, bytes_run)
    assert encode(PROMPT) == list(PROMPT.encode("utf-8"))
    assert decode(list(b"def f(x)")) == ByteTokenizer().decode(list(b"def f(x)"))


def test_generate_keeps_the_runs_bpe_copy_and_says_the_dataset_changed(bpe_run, corpora, capsys):
    code = generate_cli.main([str(bpe_run), "--prompt", "def f_1", "--max-new-tokens", "3", "--device", "cpu",
                              "--temperature", "0"])
    assert code == 0
    warning, = [line for line in stderr_lines(capsys) if line.startswith("warning: ")]
    assert "now holds ids of tokenizer bytes (bos_id=256)" in warning
    assert f"trained on ids of tokenizer bpe-300 (bos_id=0, {bpe_run / 'tokenizer.json'})" in warning
    _, cfg = load_run(bpe_run, device="cpu")
    truth = BPETokenizer.from_file(corpora["bpe"] / "tokenizer.json")
    assert generate_cli.run_codec(cfg, bpe_run)[0]("def f_1") == truth.encode("def f_1")


def test_a_text_prompt_is_read_after_the_runs_bos(bpe_run, bytes_run):
    """Every training document began with BOS (inputs[:, 0]), and so does a --prompt: the run's recorded BOS (the BPE
    run's 0, though its dataset now holds bytes, whose BOS is 256), then the prompt's ids."""
    out = generate_cli.generate_from_run(bpe_run, 2, prompt="def f_1", temperature=0, device="cpu")
    _, cfg = load_run(bpe_run, device="cpu")
    assert out["prompt_ids"] == [0, *generate_cli.run_codec(cfg, bpe_run)[0]("def f_1")]
    out = generate_cli.generate_from_run(bytes_run, 2, prompt="def f", temperature=0, device="cpu")
    assert out["prompt_ids"] == [256, *b"def f"]
    model, _ = load_run(bytes_run, device="cpu")   # the continuation is the model's greedy after BOS + prompt
    assert out["ids"] == model.generate(torch.tensor([[256, *b"def f"]]), 2, temperature=0)[0, -2:].tolist()


def test_generate_refuses_when_the_runs_bpe_is_gone(bpe_run, tmp_path, capsys):
    """Its kept copy gone (a run folder shared without it) and its dataset re-prepared with bytes: the run's BPE
    cannot be loaded, and the dataset's bytes are not it."""
    run = tmp_path / "run"
    shutil.copytree(bpe_run, run)
    (run / "tokenizer.json").unlink()
    code = generate_cli.main([str(run), "--prompt", "def f_1", "--max-new-tokens", "3", "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    data = bpe_run.parent / "ds"
    assert captured.err.strip().splitlines() == [
        f"error: --prompt: the run was trained on ids of tokenizer bpe-300 (bos_id=0), but its dataset, "
        f"data.path={str(data)!r}, now holds ids of tokenizer bytes (bos_id=256); the run's tokenizer cannot be "
        f"loaded: give --prompt-ids"]


def test_a_bpe_of_the_same_size_and_bos_is_told_apart_by_its_hash(tmp_path, train_run, corpora, capsys):
    """Trained on one BPE of 300 ids, its dataset since prepared with another of 300 ids and the same BOS (other
    text), the run's copy gone: the name and BOS agree, the file's SHA-256 recorded at launch does not, so generate
    refuses rather than encode with the other vocabulary, and evaluate refuses the other data."""
    import hashlib
    import json

    run = retokenized_run(tmp_path, train_run, corpora, "bpe", "bpe_other")
    recorded = json.loads((run / "data_identity.json").read_text())["train"]["tokenizer_sha256"]
    assert recorded == hashlib.sha256((corpora["bpe"] / "tokenizer.json").read_bytes()).hexdigest()
    (run / "tokenizer.json").unlink()
    code = generate_cli.main([str(run), "--prompt", "def f_1", "--max-new-tokens", "3", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --prompt: the run was trained on ids of "
                                                              "tokenizer bpe-300 (bos_id=0), but its dataset")
    code = evaluate_main([str(run), "--docs", "2", "--out", str(tmp_path / "out.json"), "--device", "cpu"])
    last = stderr_lines(capsys)[-1]
    assert code == 2 and not (tmp_path / "out.json").exists()
    held = tmp_path / "ds" / "heldout.zarr"
    assert last.startswith(f"error: data: {held} holds ids of tokenizer bpe-300 (bos_id=0, ")
    assert last.endswith("evaluate it on data of its own tokenizer") and f"{run} was trained" in last


# -- splits and evaluated data compared by tokenizer and BOS --------------------------------------------------------

def mixed(root: Path, train: Path, heldout: Path) -> Path:
    """A dataset folder of `train`'s training split (with its tokenizer file) and `heldout`'s heldout split."""
    root.mkdir()
    shutil.copytree(train / "train.zarr", root / "train.zarr")
    shutil.copytree(heldout / "heldout.zarr", root / "heldout.zarr")
    if (train / "tokenizer.json").is_file():
        shutil.copy(train / "tokenizer.json", root / "tokenizer.json")
    return root


def test_splits_of_different_tokenizers_do_not_train(corpora, tmp_path, compose):
    """A BPE training split (300 ids) beside a byte heldout split: every heldout id fits the model's vocabulary, so
    only the tokenizers tell them apart."""
    from longctx.train.trainer import Trainer

    data = mixed(tmp_path / "mixed", corpora["bpe"], corpora["bytes"])
    with pytest.raises(ValueError) as err:
        Trainer(compose(*TRAIN, f"data.path={data}", f"run_dir={tmp_path / 'run'}"))
    assert str(err.value) == (
        f"data.heldout_split: {data / 'heldout.zarr'} holds ids of tokenizer bytes (bos_id=256), but "
        f"data.train_split {data / 'train.zarr'} holds ids of tokenizer bpe-300 (bos_id=0, {data / 'tokenizer.json'}); "
        f"prepare both splits with one tokenizer")
    assert not (tmp_path / "run").exists()


def test_splits_of_two_bpes_of_one_size_are_told_apart(corpora):
    """Two BPEs of 300 ids trained on other text share their name and BOS: their vocabulary files differ."""
    root = corpora["bpe"]
    cfg = OmegaConf.create({"name": "source_corpus", "path": str(root), "train_split": "train.zarr",
                            "heldout_split": str(corpora["bpe_other"] / "heldout.zarr"), "pack": False})
    with pytest.raises(ValueError, match=r"^data.heldout_split: .*bpe_other/heldout.zarr holds ids of tokenizer "
                                         r"bpe-300 \(bos_id=0, .*bpe_other/tokenizer.json\), but data.train_split "
                                         r".*bpe/train.zarr holds ids of tokenizer bpe-300 \(bos_id=0, "
                                         r".*bpe/tokenizer.json\);"):
        resolve_splits(cfg, 128)
    cfg.heldout_split = "heldout.zarr"
    assert resolve_splits(cfg, 128).heldout_path == root / "heldout.zarr"  # one preparation: accepted


@pytest.mark.parametrize("task", ["heldout", "passkey"])
def test_evaluate_refuses_data_of_another_tokenizer(bpe_run, corpora, tmp_path, capsys, task):
    """The BPE run (300 ids) on byte data (257 ids: they fit its vocabulary) would score text it never read."""
    data = corpora["bytes"]
    code = evaluate_main([str(bpe_run), "data=source_corpus", f"data.path={data}", "--task", task,
                          "--out", str(tmp_path / "out.json"), "--device", "cpu"])
    assert code == 2 and not (tmp_path / "out.json").exists()
    assert stderr_lines(capsys)[-1] == (
        f"error: data: {data / 'heldout.zarr'} holds ids of tokenizer bytes (bos_id=256), but {bpe_run} was trained "
        f"on ids of tokenizer bpe-300 (bos_id=0, {bpe_run / 'tokenizer.json'}), as its data_identity.json records; "
        f"evaluate it on data of its own tokenizer")


def test_evaluate_takes_data_of_the_runs_tokenizer(bpe_run, corpora, tmp_path):
    code = evaluate_main([str(bpe_run), "data=source_corpus", f"data.path={corpora['bpe']}", "--docs", "2",
                          "--out", str(tmp_path / "out.json"), "--device", "cpu"])
    assert code == 0 and (tmp_path / "out.json").is_file()


def test_generate_reads_a_run_whose_data_record_is_damaged(bpe_run, tmp_path, capsys):
    """An unreadable data_identity.json does not stop generate: the run's kept BPE still encodes the prompt (the
    tokenizer file read on its own is the truth), and a warning names the damaged record."""
    from longctx.data.tokenizer import BPETokenizer
    from longctx.train.console import setup_logging

    run = tmp_path / "run"
    shutil.copytree(bpe_run, run)
    (run / "data_identity.json").write_text("{not json")
    setup_logging()
    res = generate_cli.generate_from_run(run, 3, prompt=PROMPT, temperature=0, device="cpu")
    kept = BPETokenizer.from_file(run / "tokenizer.json")   # BOS: the kept BPE's end-of-text, as its corpus's
    assert res["prompt_ids"] == [kept.eot_id, *kept.encode(PROMPT)]
    assert stderr_lines(capsys) == [f"warning: {run / 'data_identity.json'}: unreadable data identity (JSONDecodeError)"
                                    f": the run's tokenizer is taken as if it recorded none"]
