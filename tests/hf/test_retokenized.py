"""An export and the lm-eval tasks of a run whose dataset was prepared again with another tokenizer: the export ships
the tokenizer the run recorded (its kept BPE copy, or bytes) with one warning naming both, and refuses in one line
where the run's BPE was only in the dataset; the harness refuses to write tasks from the re-prepared data, as
evaluate does. Tiny GPT-2 runs trained 2 steps on prepared text corpora (CPU, seconds); the truth is the tokenizer
files and texts each corpus was prepared from."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import longctx.export as export_cli  # noqa: E402
from longctx.data.tokenizer import BPETokenizer, ByteTokenizer  # noqa: E402
from longctx.hf.export import ExportError, export_run  # noqa: E402
from longctx.train.console import setup_logging  # noqa: E402
from tests.test_run_tokenizer import TRAIN, WORDS, write_packages  # noqa: E402
from tests.test_run_tokenizer import prepare as prepare_as_run_tokenizer_does  # noqa: E402

TEXT = "def f_1(x):\n    return alpha beta river\n"


def prepare(source: Path, out: Path, tokenizer: str, vocab_size: int = 300) -> Path:
    return prepare_as_run_tokenizer_does(source, out, tokenizer, vocab_size, heldout_docs=4)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """One text prepared three ways: bytes, a BPE of 300 ids, a BPE of 320 ids."""
    root = tmp_path_factory.mktemp("corpora")
    site = write_packages(root / "site", WORDS)
    return {"bytes": prepare(site, root / "bytes", "bytes"), "bpe-300": prepare(site, root / "bpe300", "bpe", 300),
            "bpe-320": prepare(site, root / "bpe320", "bpe", 320)}


def trained_on(root: Path, train_run, corpus: Path) -> Path:
    shutil.copytree(corpus, root / "ds")
    return train_run(root / "run", [*TRAIN, f"data.path={root / 'ds'}"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train_run, corpora):
    """{"bytes": a run trained on the byte corpus, "bpe-300": one on the 300-id BPE}, each with its own data folder."""
    return {name: trained_on(tmp_path_factory.mktemp(name), train_run, corpora[name]) for name in ("bytes", "bpe-300")}


def prepared_again(run: Path, corpus: Path) -> Path:
    """The run's data folder, holding `corpus` from now on (the dataset prepared again) -> the folder."""
    data = run.parent / "ds"
    shutil.rmtree(data)
    shutil.copytree(corpus, data)
    return data


def without_kept_copy(run: Path, tmp_path: Path) -> Path:
    """The run shared without the tokenizer file it keeps (its config still names its data folder)."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "tokenizer.json").unlink()
    return copy


def warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]


def said_changed(data: Path, now: str, trained: str) -> str:
    return (f"warning: data.path={str(data)!r} now holds ids of {now}; the run was trained on ids of {trained}, as "
            f"its data_identity.json records: using the run's tokenizer")


# -- export ---------------------------------------------------------------------------------------------------------

def test_export_refuses_a_bpe_the_run_no_longer_has(runs, corpora, tmp_path, capsys):
    """Trained on the 300-id BPE, shared without its copy, its dataset since prepared with a 320-id BPE: that one is
    not the model's tokenizer, and nothing is exported."""
    data = prepared_again(runs["bpe-300"], corpora["bpe-320"])
    run = without_kept_copy(runs["bpe-300"], tmp_path)
    line = (f"data.path={str(data)!r} now holds ids of tokenizer bpe-320 (bos_id=0, {data / 'tokenizer.json'}), but "
            f"{run} was trained on ids of tokenizer bpe-300 (bos_id=0) and keeps no tokenizer.json of its own: the "
            f"run's tokenizer cannot be exported; put the run's tokenizer.json back in {run}")
    with pytest.raises(ExportError) as err:
        export_run(run, tmp_path / "hf")
    assert str(err.value) == line
    assert export_cli.main([str(run), "--out", str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {line}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no export, no temp folder


def test_export_ships_the_runs_kept_bpe_and_says_the_dataset_changed(runs, corpora, tmp_path, capsys):
    data = prepared_again(runs["bpe-300"], corpora["bytes"])
    run = runs["bpe-300"]
    setup_logging()
    tok = transformers.AutoTokenizer.from_pretrained(export_run(run, tmp_path / "hf"))
    truth = BPETokenizer.from_file(corpora["bpe-300"] / "tokenizer.json")
    assert tok(TEXT)["input_ids"] == truth.encode(TEXT) != list(TEXT.encode())
    assert warnings(capsys) == [said_changed(data, "tokenizer bytes (bos_id=256)",
                                             f"tokenizer bpe-300 (bos_id=0, {run / 'tokenizer.json'})")]


def test_export_ships_bytes_for_a_byte_run_and_says_the_dataset_changed(runs, corpora, tmp_path, capsys):
    data = prepared_again(runs["bytes"], corpora["bpe-300"])
    setup_logging()
    tok = transformers.AutoTokenizer.from_pretrained(export_run(runs["bytes"], tmp_path / "hf"))
    assert tok(TEXT)["input_ids"] == ByteTokenizer().encode(TEXT) == list(TEXT.encode())
    assert warnings(capsys) == [said_changed(data, f"tokenizer bpe-300 (bos_id=0, {data / 'tokenizer.json'})",
                                             "tokenizer bytes (bos_id=256)")]


def test_export_takes_the_datasets_bpe_while_it_is_the_runs(runs, corpora, tmp_path, capsys):
    prepared_again(runs["bpe-300"], corpora["bpe-300"])
    run = without_kept_copy(runs["bpe-300"], tmp_path)
    setup_logging()
    tok = transformers.AutoTokenizer.from_pretrained(export_run(run, tmp_path / "hf"))
    assert tok(TEXT)["input_ids"] == BPETokenizer.from_file(corpora["bpe-300"] / "tokenizer.json").encode(TEXT)
    assert warnings(capsys) == []


# -- the lm-eval harness --------------------------------------------------------------------------------------------

def test_harness_refuses_tasks_from_data_of_another_tokenizer(runs, corpora, tmp_path):
    pytest.importorskip("lm_eval")
    from longctx.hf.harness import generate

    data = prepared_again(runs["bytes"], corpora["bpe-300"])
    run = runs["bytes"]
    with pytest.raises(ValueError) as err:
        generate(run, tmp_path / "tasks", "heldout", docs=2)
    assert str(err.value) == (
        f"data: {data / 'heldout.zarr'} holds ids of tokenizer bpe-300 (bos_id=0, {data / 'tokenizer.json'}), but "
        f"{run} was trained on ids of tokenizer bytes (bos_id=256), as its data_identity.json records; give --text "
        f"FILE: documents of your own text, read with the run's tokenizer")
    assert not (tmp_path / "tasks").exists()


def test_harness_takes_text_in_the_runs_tokenizer_instead(runs, corpora, tmp_path):
    pytest.importorskip("lm_eval")
    import json

    from longctx.hf.harness import generate

    prepared_again(runs["bytes"], corpora["bpe-300"])
    text = tmp_path / "notes.txt"
    text.write_text(TEXT * 40)
    generate(runs["bytes"], tmp_path / "tasks", "heldout", text=text, docs=1)
    rows = [json.loads(line) for line in (tmp_path / "tasks" / "longctx_heldout.jsonl").read_text().splitlines()]
    assert rows[-1]["choices"][-1] == (TEXT * 40)[:128]  # the document: the text's first ctx bytes, read as bytes


def test_harness_takes_data_of_the_runs_tokenizer(runs, corpora, tmp_path):
    pytest.importorskip("lm_eval")
    from longctx.hf.harness import generate

    prepared_again(runs["bytes"], corpora["bytes"])
    summary = generate(runs["bytes"], tmp_path / "tasks", "heldout", docs=2)
    assert summary["tasks"] == ["longctx_heldout"] and (tmp_path / "tasks" / "longctx_heldout.jsonl").is_file()
