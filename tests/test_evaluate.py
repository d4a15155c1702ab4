"""Trained checkpoints put to use: load_run (old configs included), `python -m longctx.evaluate` at other context
lengths and data (the README's form on a small prepared dataset), its retrieval tasks, `python -m longctx.generate`,
and their one-line errors (every argument checked before any work; nothing written). One tiny power-attention run is
trained once for the module (CPU, a few seconds)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import zarr

import pytest
import torch
import torch.nn.functional as F

from longctx import load_run
from longctx.data import heldout_batch
from longctx.eval import bin_docs, exponential_bins, min_positions_for, read_doc_record
from longctx.evaluate import compose_data, main as evaluate_main
from longctx.generate import main as generate_main
from longctx.train import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["trainer.max_steps=4", "trainer.eval_every=4", "logger.wandb.mode=disabled", "data.train_tokens=65536",
         "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
         "trainer.num_threads=2", "attention=power", "p=2", "attention.chunk_size=16", "optim.warmup_steps=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "power", TRAIN)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A small dataset in the LongCrawl64 layout (what scripts/prepare_dataset.py writes): ids 0..3, BOS 4."""
    root = tmp_path_factory.mktemp("lc64")
    rng = np.random.default_rng(7)
    for split, n in (("train.zarr", 8), ("heldout.zarr", 6)):
        arr = zarr.create_array(str(root / split), shape=(n, 256), chunks=(4, 128), dtype="uint16",
                                attributes={"bos_id": 4, "vocab_size": 5, "max_token_id": 3})
        arr[:] = rng.integers(0, 4, size=(n, 256), dtype=np.uint16)
    return root


def files_under(*folders):
    return sorted(p for folder in folders if folder.exists() for p in folder.rglob("*"))


def model_nll(run, inputs, targets):
    """Independent truth: cross-entropy of the checkpoint's logits, every token (n, T) float64."""
    model, _ = load_run(run, device="cpu")
    with torch.no_grad():
        logits = model(inputs)
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").double()


def cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def one_error_line(capsys, code, words):
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()  # above it at most progress bars (a dataset generated)
    assert err[-1].startswith("error: ") and words in err[-1], err
    assert not any(line.startswith(("Traceback", "error: ")) for line in err[:-1]), err


# -- load_run -----------------------------------------------------------------------------------------------

def test_load_run_gives_the_trained_model(run):
    model, cfg = load_run(run, device="cpu")
    assert not model.training and model.checkpoint_step == 4 and cfg.ctx == 64
    assert model.spec.attention == "power" and model.spec.attention_params["chunk_size"] == 16
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def test_load_run_maps_an_old_style_config(run, tmp_path):
    """A checkpoint written before attention parameters moved into the core: the config's attention group without
    output_norm and a flat spec (p, window, chunk_size, gating as fields). Same weights, same logits."""
    model, _ = load_run(run, device="cpu")
    old = tmp_path / "old"
    (old / "checkpoints").mkdir(parents=True)
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])
    state["config"]["attention"] = {"name": "power", "p": 2, "tag": "power_p2", "chunk_size": 16, "gating": True}
    spec = {k: v for k, v in state["spec"].items() if k != "attention_params"}
    state["spec"] = spec | dict(p=2, window=1024, chunk_size=16, gating=True)
    torch.save(state, old / "checkpoints" / "step_00000004.pt")
    loaded, cfg = load_run(old, device="cpu")
    assert loaded.spec.attention_params == {"p": 2, "chunk_size": 16, "gating": True, "output_norm": False}
    x = torch.randint(0, model.spec.vocab_size, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_load_run_errors_name_the_problem(run, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoint") as err:
        load_run(tmp_path / "empty")
    assert "run folder" not in str(err.value)
    with pytest.raises(ValueError, match=rf"{run / 'config.yaml'}' is a file, not a run folder; its folder "
                                         rf"'{run}' is a run"):
        load_run(run / "config.yaml")
    with pytest.raises(ValueError, match=rf"{run / 'checkpoints' / 'step_00000004.pt'}' is a file, not a run folder; "
                                         rf"it is a checkpoint of the run '{run}': name the run, with --step 4$"):
        load_run(run / "checkpoints" / "step_00000004.pt")
    with pytest.raises(ValueError, match=rf"holds no checkpoint .*; it holds 1 run folder \({run.name}\): name one"):
        load_run(run.parent)
    with pytest.raises(ValueError, match=r"step=3: .* has steps 4"):
        load_run(run, step=3)


# -- evaluate -----------------------------------------------------------------------------------------------

def test_evaluate_at_twice_the_training_context(run, tmp_path, capsys, monkeypatch):
    import matplotlib.pyplot as plt
    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # the ICL figure kept open to be read
    out = tmp_path / "eval" / "ctx128.json"
    assert evaluate_main([str(run), "--ctx", "128", "--docs", "6", "--out", str(out), "--device", "cpu"]) == 0
    (marker,) = [line for line in drawn[-1].axes[0].get_lines() if line.get_label() == "training context (64)"]
    assert list(marker.get_xdata()) == [64, 64]
    rec = json.loads(out.read_text())
    assert (rec["ctx"], rec["train_ctx"], rec["docs"], rec["step"]) == (128, 64, 6, 4)
    # how it was evaluated: the device, the precision as resolved, the documents a forward held, no data overrides
    assert (rec["device"], rec["precision"], rec["data_overrides"]) == ("cpu", "fp32", [])
    assert rec["micro_docs"] >= 1
    assert len(rec["per_position_loss"]) == 128
    assert rec["icl_curve"][0][0] == 0 and rec["icl_curve"][-1][1] == 128
    # best context: the lowest bin among those wide enough to trust
    trusted = [v for lo, hi, v in rec["icl_curve"] if hi - lo >= min_positions_for(128)]
    assert rec["best_context_loss"] == min(trusted)
    assert [b[:2] for b in rec["bayes_curve"]] == [b[:2] for b in rec["icl_curve"]]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "best-context loss" in capsys.readouterr().out
    # independent truth: cross-entropy of the model's logits on the same heldout documents
    data = heldout_batch(rec["data"]["heldout"], 128, 6)
    per_token = model_nll(run, data["inputs"], data["targets"])
    nll = per_token.mean(0)
    torch.testing.assert_close(torch.tensor(rec["per_position_loss"], dtype=torch.float64), nll, rtol=0, atol=2e-5)
    last10 = nll[-13:].mean().item()  # ceil(10% of 128) = 13 positions
    assert rec["last10_loss"] == pytest.approx(last10, abs=1e-5)
    # the per-document record beside it, as the trainer writes it
    assert rec["doc_bins"] == "ctx128.npz"
    doc = read_doc_record(out.with_suffix(".npz"))
    assert doc["edges"].tolist() == [b[:2] for b in rec["icl_curve"]] and doc["doc_index"].tolist() == list(range(6))
    np.testing.assert_allclose(doc["loss"], bin_docs(per_token.numpy(), doc["edges"]), rtol=0, atol=2e-5)
    np.testing.assert_allclose(doc["bayes"].mean(0), [b[2] for b in rec["bayes_curve"]], rtol=0, atol=2e-6)


def test_evaluate_cli_runs_shorter_than_training(run, tmp_path):
    out = tmp_path / "ctx32.json"
    proc = cli("longctx.evaluate", run, "--ctx", 32, "--out", out, "--device", "cpu", "--bins", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["ctx"] == 32 and [b[:2] for b in rec["icl_curve"]] == [list(b) for b in exponential_bins(32, 4)]


def test_evaluate_the_readme_form_on_a_prepared_dataset(run, prepared, tmp_path):
    """`python -m longctx.evaluate RUN --ctx C data=longcrawl64 data.path=... --docs M --out F` as the README shows
    it: data.path is a `???` key of the longcrawl64 data config, set on the command line."""
    out = tmp_path / "lc64.json"
    proc = cli("longctx.evaluate", run, "--ctx", 128, "data=longcrawl64", f"data.path={prepared}", "--docs", 4,
               "--out", out, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["data"] == {"name": "longcrawl64", "heldout": str(prepared / "heldout.zarr")}
    assert (rec["ctx"], rec["docs"]) == (128, 4) and "bayes_curve" not in rec
    data = heldout_batch(prepared / "heldout.zarr", 128, 4)
    nll = model_nll(run, data["inputs"], data["targets"])
    np.testing.assert_allclose(rec["per_position_loss"], nll.mean(0).numpy(), rtol=0, atol=2e-5)
    doc = read_doc_record(out.with_suffix(".npz"))
    assert set(doc) == {"loss", "edges", "doc_index"}  # no exact optimum for this data
    assert f"wrote {out}" in proc.stdout


def test_data_overrides_compose_the_real_data_group(run):
    """data=NAME is conf/data/NAME.yaml composed by Hydra (its defaults chain included), then data.KEY=VALUE."""
    _, run_cfg = load_run(run, device="cpu")
    cfg = compose_data(run_cfg, ["data=icl_markov_long_cpu", "data.doc_len=128", "data.state_counts=[4,8]"])
    assert (cfg.data.tag, cfg.data.vocab, cfg.data.alpha, cfg.data.doc_len) == ("icl_markov_long_cpu", 32, 0.05, 128)
    assert list(cfg.data.state_counts) == [4, 8] and cfg.data.cache_dir == run_cfg.data.cache_dir
    assert cfg.ctx == run_cfg.ctx and cfg.model == run_cfg.model  # only the data changes
    lc = compose_data(run_cfg, ["data=longcrawl64", "data.path=/some/where", "data.eval_docs=3"])
    assert (lc.data.path, lc.data.eval_docs) == ("/some/where", 3)
    # a tag drawn from the data's keys follows the overrides (the default file name and the record name the data)
    mqar = compose_data(run_cfg, ["data=mqar", "data.n_pairs=4"])
    assert mqar.data.tag == "mqar_n4"
    assert compose_data(mqar, ["data.n_pairs=8"]).data.tag == "mqar_n8"
    assert compose_data(mqar, ["data.eval_docs=4"]).data.tag == "mqar_n4"
    assert compose_data(mqar, ["data.n_pairs=8", "data.tag=mine"]).data.tag == "mine"


def test_default_out_is_a_new_file_in_the_run_folder(run, capsys):
    before = files_under(run)
    assert evaluate_main([str(run), "--docs", "2", "--device", "cpu"]) == 0
    first = Path(capsys.readouterr().out.splitlines()[-1].split()[1].rstrip(","))
    assert first.parent == run / "eval" and first.name.startswith("ctx64-step4-icl_markov")
    text = first.read_text()
    assert evaluate_main([str(run), "--docs", "2", "--device", "cpu"]) == 0
    second = Path(capsys.readouterr().out.splitlines()[-1].split()[1].rstrip(","))
    assert second != first and second.parent == first.parent and first.read_text() == text  # nothing overwritten
    for path in (first, second):
        for p in (path, path.with_suffix(".npz"), path.with_suffix(".png")):
            p.unlink()
    assert files_under(run) == before


def test_a_default_name_taken_meanwhile_moves_on_and_loses_nothing(run, capsys, monkeypatch):
    """Another evaluate of the run writes the default name while this one works (the names are picked at the start):
    this one's results go to the next free name, the other's stay as written; a name the user gave stays an error."""
    import longctx.evaluate as evaluate_module

    before = files_under(run)
    write_json, taken = evaluate_module.write_json, []

    def other_first(path, record):   # the concurrent evaluation lands at this name just before this one writes
        if not taken:
            taken.append(path)
            write_json(path, {"other": True})
        write_json(path, record)
    monkeypatch.setattr(evaluate_module, "write_json", other_first)
    assert evaluate_main([str(run), "--docs", "2", "--device", "cpu"]) == 0
    mine = Path(capsys.readouterr().out.splitlines()[-1].split()[1].rstrip(","))
    assert mine == taken[0].with_name(taken[0].stem + "-2.json") and json.loads(taken[0].read_text()) == {"other": True}
    assert json.loads(mine.read_text())["doc_bins"] == mine.with_suffix(".npz").name and mine.with_suffix(".npz").exists()
    taken.clear()
    given = run / "eval" / "given.json"
    assert evaluate_main([str(run), "--docs", "2", "--device", "cpu", "--out", str(given)]) == 2
    assert json.loads(given.read_text()) == {"other": True}
    for path in (mine, taken[0] if taken else given):
        for p in (path, path.with_suffix(".npz"), path.with_suffix(".png")):
            p.unlink(missing_ok=True)
    for p in (run / "eval").glob("ctx64-step4-icl_markov*"):
        p.unlink()
    assert files_under(run) == before


BAD = {  # extra arguments -> the words of the one error line
    "missing run": ([], "does not exist"),
    "no checkpoints": ([], "holds no checkpoint"),
    "unknown attention": ([], "attention.name='flash': unknown attention; known: exp, linear, power"),
    "ctx beyond documents": (["--ctx", "512"], "--ctx=512 is larger than the documents"),
    "ctx too small": (["--ctx", "1"], "--ctx=1: must be an integer >= 2"),
    "data vocabulary too large": (["data.vocab=9"], "data vocabulary 10"),
    "unknown data key": (["data.vocabb=9"], "data.vocabb: not a key of the icl_markov data config"),
    "unknown data config": (["data=nodata"], "data=nodata: no such data config; known: icl_markov"),
    "mistyped data key": (["data.vocabb=9"], "); did you mean vocab?"),
    "mistyped data config": (["data=longcrawl"], "source_corpus; did you mean longcrawl64?"),
    "data null": (["data=null"], "'data=null': expected data=NAME, the name of a conf/data config"),
    "not a data override": (["model.d_model=8"], "'model.d_model=8': expected a data override"),
    "a flag written as an override": (["ctx=256"], "expected a data override, data=NAME or data.KEY=VALUE (the "
                                                   "option --ctx 256?)"),
    "data path missing": (["data=longcrawl64"], "config: data.path is mandatory and not set"),
    "data path nowhere": (["data=longcrawl64", "data.path=/nowhere/lc64"], "data.path='/nowhere/lc64': does not"),
    "eval_docs not a number": (["data.eval_docs=abc"], "config: data.eval_docs='abc': must be an integer"),
    "docs_per_batch not a number": (["data.docs_per_batch=abc"], "data.docs_per_batch='abc': must be an integer >= 1"),
    "docs_per_batch zero": (["data.docs_per_batch=0"], "data.docs_per_batch=0: must be an integer >= 1"),
    "micro-docs negative": (["--micro-docs", "-1"], "--micro-docs=-1: must be an integer >= 1"),
    "micro-docs zero": (["--micro-docs", "0"], "--micro-docs=0: must be an integer >= 1"),
    "bins zero": (["--bins", "0"], "--bins=0: must be an integer >= 1"),
    "bins too many": (["--bins", "1000"], "--bins=1000: at ctx=128 its widest bin holds 1 positions"),
    "docs zero": (["--docs", "0"], "--docs=0: must be an integer >= 1"),
    "device without cuda": (["--device", "cuda"], "--device='cuda': no CUDA device is available"),
    "device unknown": (["--device", "tpu"], "--device='tpu': expected auto, cpu, cuda or cuda:N"),
    "out a folder": (["--out", "{tmp}"], "is a folder; give a file name"),
    "out under a file": (["--out", "{tmp}/file.txt/x.json"], "file.txt is a file, not a folder"),
    "out not json": (["--out", "{tmp}/x.txt"], "must end in .json"),
    "out exists": (["--out", "{tmp}/old.json"], "old.json exists and is never overwritten"),
    "out plot exists": (["--out", "{tmp}/old2.json"], "old2.png exists and is never overwritten"),
    "retrieval flag on heldout": (["--contexts", "64"], "--contexts: an option of the retrieval tasks"),
    "heldout flag on retrieval": (["--task", "passkey", "--docs", "3"], "--docs: an option of the heldout task"),
    "seed on heldout": (["--seed", "7"], "--seed: an option of the retrieval tasks"),
    "no-wandb on heldout": (["--no-wandb"], "--no-wandb: an option of the retrieval tasks"),
    "trials on heldout": (["--trials", "2"], "--trials: an option of the retrieval tasks"),
    "zero bins on retrieval": (["--task", "passkey", "--bins", "0"], "--bins: an option of the heldout task"),
    "contexts too short": (["--task", "passkey", "--contexts", "20"], "--contexts: 20 is shorter than a prompt's"),
    "contexts not numbers": (["--task", "passkey", "--contexts", "a,b"], "--contexts='a,b': expected comma-sep"),
    "depths out of range": (["--task", "needle", "--depths", "0,2"], "--depths='0,2': expected one or more fract"),
    "trials zero": (["--task", "needle", "--trials", "0"], "--trials=0: must be an integer >= 1"),
    "needle trials beyond documents": (["--task", "needle", "--trials", "40", "--contexts", "64"],
                                       "--trials=40: only 16 of the 16 heldout documents"),
}


def test_evaluate_without_arguments_asks_only_for_the_run(capsys):
    """The data overrides are optional: argparse's usage line names only the run folder as required."""
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.strip().endswith("the following arguments are required: run_dir"), err


@pytest.mark.parametrize("case", list(BAD))
def test_evaluate_bad_input_is_one_line(run, tmp_path, capsys, case):
    """Each bad argument: one `error:` line naming it, exit 2, and nothing written (not even after an evaluation)."""
    if case == "device without cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    extra, words = BAD[case]
    run_dir = run
    if case == "missing run":
        run_dir = tmp_path / "nowhere"
    elif case == "no checkpoints":
        run_dir = tmp_path / "fresh"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text((run / "config.yaml").read_text())
    elif case == "unknown attention":
        run_dir = tmp_path / "renamed"
        (run_dir / "checkpoints").mkdir(parents=True)
        state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])
        state["config"]["attention"]["name"] = "flash"
        torch.save(state, run_dir / "checkpoints" / "step_00000004.pt")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "old2.png").write_text("x")
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    args = [str(run_dir), "--device", "cpu", *extra]
    if "--device" in extra:
        args = [str(run_dir), *extra]
    if "--out" not in extra:
        args += ["--out", str(tmp_path / "x.json")]
    if "--task" not in extra and "--contexts" not in extra:
        args += ([] if "--ctx" in extra else ["--ctx", "128"]) + ([] if "--docs" in extra else ["--docs", "2"])
    before_tmp, before_run = files_under(tmp_path), files_under(run)
    one_error_line(capsys, evaluate_main(args), words)
    assert files_under(tmp_path) == before_tmp and files_under(run) == before_run


@pytest.mark.parametrize("task", ["heldout", "passkey"])
def test_generated_data_of_another_vocabulary_is_refused_before_generation(run, tmp_path, capsys, monkeypatch, task):
    """`data=mqar` on an ICL-Markov run: the vocabularies (4,098 against the model's 5) are compared from the
    configs, so the refusal comes before the MQAR dataset is generated (nothing generated, nothing written)."""
    import longctx.train.data as train_data

    generated = []
    monkeypatch.setattr(train_data, "ensure_mqar", lambda *a, **k: generated.append(k) or pytest.fail("generated"))
    monkeypatch.setattr(train_data, "ensure_icl_markov", lambda *a, **k: generated.append(k) or pytest.fail("gen"))
    before = files_under(run)
    for overrides, words in ((["data=mqar"], "data vocabulary 4098 (data=mqar: data.n_keys + data.n_values + "
                                             "filler + BOS) does not fit the model's vocabulary 5"),
                             (["data.vocab=9"], "data vocabulary 10 (data=icl_markov: data.vocab + BOS)")):
        args = [str(run), *overrides, "--task", task, "--device", "cpu", "--out", str(tmp_path / "x.json")]
        one_error_line(capsys, evaluate_main(args), words)
    assert generated == [] and files_under(tmp_path) == [] and files_under(run) == before


def test_evaluate_non_finite_checkpoint_is_one_line_and_writes_nothing(run, tmp_path, capsys):
    run_dir = tmp_path / "nan"
    (run_dir / "checkpoints").mkdir(parents=True)
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])
    state["model"] = {k: v.float().fill_(float("nan")) if v.is_floating_point() else v for k, v in state["model"].items()}
    torch.save(state, run_dir / "checkpoints" / "step_00000004.pt")
    before = files_under(run_dir)
    assert evaluate_main([str(run_dir), "--device", "cpu", "--docs", "2"]) == 2  # refused before evaluating
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"error: {run_dir / 'checkpoints' / 'step_00000004.pt'}: non-finite weights (wte.weight"), err
    assert files_under(run_dir) == before


def test_evaluate_out_where_no_file_can_be_made_is_refused_first(run, tmp_path, capsys, monkeypatch):
    """A folder that refuses new files (read-only, full, not ours), as the OS reports it to the probe: refused before
    the run is even loaded."""
    import longctx.evaluate as evaluate_module

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(evaluate_module.tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(evaluate_module, "load_run", lambda *a, **k: pytest.fail("loaded the run before checking"))
    one_error_line(capsys, evaluate_main([str(run), "--device", "cpu", "--out", str(tmp_path / "x.json")]),
                   f"cannot write into {tmp_path} (Permission denied)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_evaluate_out_in_a_read_only_folder_is_refused_first(run, tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code = evaluate_main([str(run), "--device", "cpu", "--out", str(folder / "x.json")])
    finally:
        folder.chmod(0o700)
    one_error_line(capsys, code, "cannot write into")


@pytest.mark.parametrize("task, args, first, last", [
    ("heldout", ["--docs", "2"], "evaluate ctx 64: started (2 docs in 1 forward of up to 2, set by the run's "
                                 "data.docs_per_batch; --micro-docs sets it; progress is counted per forward)",
     r"evaluate ctx 64: done, 2/2 docs in \d+s"),
    ("passkey", ["--task", "passkey", "--contexts", "40,64", "--trials", "2"], "passkey: started (2 contexts)",
     r"passkey: done, 2/2 contexts in \d+s")])
def test_evaluate_says_its_progress_on_stderr_when_not_a_terminal(run, tmp_path, capsys, task, args, first, last):
    """No bar in a pipe or log file (stderr is not a terminal under pytest): a start line and a done line with the
    time it took; stdout keeps the result."""
    assert evaluate_main([str(run), *args, "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("estimate: the forwards of ") and lines[1] == first, lines
    assert re.fullmatch(last, lines[-1]), lines
    assert "started" not in out and "done," not in out


def test_evaluate_says_how_its_forwards_go_before_the_first(run, tmp_path, capsys, monkeypatch):
    """Progress is counted per forward, and one forward of long documents can take minutes on a CPU: how long the
    forwards take, and how many forwards of how many documents, is said before the first forward starts."""
    from longctx.eval import loss

    real, before = loss.nll_batches, []

    def watched(*args, **kwargs):
        before.append(capsys.readouterr().err)  # what stderr held when the forwards began
        yield from real(*args, **kwargs)

    monkeypatch.setattr(loss, "nll_batches", watched)
    assert evaluate_main([str(run), "--docs", "5", "--micro-docs", "2", "--device", "cpu",
                          "--out", str(tmp_path / "x.json")]) == 0
    estimate, started = before[0].splitlines()
    assert re.fullmatch(r"estimate: the forwards of 5 docs at ctx 64 take ~\d+ s on cpu \(\S+ forward FLOPs at ~\S+ "
                        r"GFLOP/s, 50% of this CPU's fp32 matmul rate, measured now, plus the attention reference's "
                        r"measured time; formulas: longctx.train.estimate\)", estimate), estimate
    assert started == ("evaluate ctx 64: started (5 docs in 3 forwards of up to 2, set by --micro-docs; progress is "
                       "counted per forward)")


def test_a_forward_estimated_over_a_minute_is_split_so_the_progress_moves(run, tmp_path, capsys, monkeypatch):
    """Without --micro-docs, a forward of the run's documents estimated over FORWARD_PACE_S is split (a forward of
    16 documents at 64k ran silent for 8 minutes on a CPU); the start line says why, and the record holds the number
    used. On a machine slowed down until one document's forward takes ~40 s: one document a forward."""
    import longctx.evaluate as evaluate_cli

    real = evaluate_cli.evaluation_seconds
    monkeypatch.setattr(evaluate_cli, "evaluation_seconds",
                        lambda model, contexts, docs, *rest: (real(model, contexts, docs, *rest)[0], 40.0 * docs))
    assert evaluate_main([str(run), "--docs", "3", "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 0
    started = next(line for line in capsys.readouterr().err.splitlines() if "started" in line)
    assert started == ("evaluate ctx 64: started (3 docs in 3 forwards of up to 1, set by a forward of 3 estimated at "
                       "~2 min (the run's number); --micro-docs sets it; progress is counted per forward)")
    assert json.loads((tmp_path / "x.json").read_text())["micro_docs"] == 1


def test_a_long_evaluation_names_a_shorter_ctx(run, tmp_path, capsys, monkeypatch):
    """An estimate over 10 minutes says so and names the longest power-of-two --ctx estimated under them. On a
    machine slowed down (its matmul rate) until the run's ctx takes 15 minutes, against the time that rate gives the
    forwards' FLOPs (the model's own count, which tests/train/test_flop_counter.py checks against torch's counter);
    the reference's measured time, which cannot be slowed down, is left out."""
    from longctx.train import estimate
    from longctx.train.flops import flops_report

    model, _ = load_run(run, device="cpu")

    def flops(ctx):  # the forwards of 8 documents at ctx
        report = flops_report(model, ctx, "cpu", torch.float32)
        return 8 * ctx * (report["weight_flops_per_token"] + report["executed_state_flops_per_token"])

    slow = 2 * flops(64) / (15 * 60)  # the estimate assumes half the matmul rate
    monkeypatch.setattr(estimate, "cpu_matmul_rate", lambda: slow)
    monkeypatch.setattr(estimate, "cpu_reference_seconds", lambda *args, **kwargs: 0.0)

    def minutes(ctx):
        return flops(ctx) / (slow / 2) / 60

    shorter = max(c for c in (2, 4, 8, 16, 32) if minutes(c) <= 10)
    assert evaluate_main([str(run), "--docs", "8", "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 0
    line = capsys.readouterr().err.splitlines()[0]
    said = re.search(r"take ~(\d+) min .*; that is long: --ctx (\d+) would take ~(\d+) (s|min), or fewer --docs$", line)
    assert said, line
    assert int(said[1]) == 15 and int(said[2]) == shorter == 32, (line, shorter)
    assert abs(int(said[3]) - minutes(32) * (60 if said[4] == "s" else 1)) <= 1, (line, minutes(32))


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_retrieval_cli_writes_accuracy_by_context_and_depth(run, tmp_path, task, capsys):
    out = tmp_path / f"{task}.json"
    assert evaluate_main([str(run), "--task", task, "--contexts", "40,64", "--depths", "0,0.5,1", "--trials", "3",
                          "--digits", "4", "--device", "cpu", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    rec = json.loads(out.read_text())
    assert (rec["task"], rec["contexts"], rec["depths"], rec["trials"], rec["digits"]) == (
        task, [40, 64], [0.0, 0.5, 1.0], 3, 4)
    assert rec["base"] == 3 and rec["chance"] == {"digit": 1 / 3, "key": 3 ** -4, "choice": 1 / 3}  # 1 marker lead
    assert rec["mean_choice_accuracy"] >= rec["mean_digit_accuracy"]  # a right free argmax is a right choice
    for grid in (rec["key_accuracy"], rec["digit_accuracy"], rec["choice_accuracy"]):
        assert len(grid) == 2 and all(len(row) == 3 and all(0 <= v <= 1 for v in row) for row in grid)
        assert all(v * 3 == round(v * 3) for row in rec["key_accuracy"] for v in row)  # a share of 3 trials
    assert 4 not in rec["marker"] + rec["alphabet"]  # never BOS
    assert out.with_suffix(".png").stat().st_size > 5_000
    assert f"{task}: key accuracy" in stdout and "wandb" not in stdout  # the run logs to no wandb run
    assert f"key accuracy {rec['mean_key_accuracy']:.1%} (chance 1.2%)" in stdout  # 3^-4 in percent, as the accuracy


# -- generate -----------------------------------------------------------------------------------------------

def test_generate_cli_prints_the_continuation_and_speed(run):
    proc = cli("longctx.generate", run, "--max-new-tokens", 12, "--prompt-ids", "4,0,1,2", "--temperature", 0,
               "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ids_line, speed_line = proc.stdout.strip().splitlines()[-2:]
    ids = [int(i) for i in ids_line.split()]
    model, _ = load_run(run, device="cpu")
    expect = model.generate(torch.tensor([[4, 0, 1, 2]]), 12, temperature=0, use_cache=False)[0, 4:].tolist()
    assert ids == expect
    assert "tokens/s" in speed_line and "cached decoding" in speed_line


@pytest.mark.parametrize("args, words", [
    (["--prompt-ids", "1,99"], "--prompt-ids: id 99 is outside the model's vocabulary 0..4"),
    (["--prompt-ids", "1,x"], "expected comma-separated integers"),
    (["--prompt", "hello"], "has no tokenizer; give --prompt-ids"),
    (["--prompt-ids", "1", "--top-k", "0"], "--top-k=0"),
])
def test_generate_bad_input_is_one_line(run, capsys, args, words):
    code = generate_main([str(run), "--max-new-tokens", "3", "--device", "cpu", *args])
    one_error_line(capsys, code, words)


def test_generate_missing_run_is_one_line(tmp_path):
    proc = cli("longctx.generate", tmp_path / "nowhere", "--max-new-tokens", 3, "--prompt-ids", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: run directory '{tmp_path / 'nowhere'}' does not exist"]


def test_retrieval_is_added_to_the_runs_own_wandb_run(run, tmp_path):
    """A run that logs to wandb (offline here) gets the retrieval result in its own wandb run (its wandb_id)."""
    from longctx.eval.plots import plot_retrieval
    from longctx.evaluate import log_to_run_wandb

    _, cfg = load_run(run, device="cpu")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = {"task": "passkey", "step": 4, "contexts": [64], "depths": [0.0, 1.0], "key_accuracy": [[1.0, 0.5]],
           "digit_accuracy": [[1.0, 0.75]], "choice_accuracy": [[1.0, 0.8]], "mean_key_accuracy": 0.75,
           "mean_digit_accuracy": 0.875, "mean_choice_accuracy": 0.9, "chance": {"key": 0.01, "digit": 0.1,
                                                                                  "choice": 0.1}}
    png = plot_retrieval(rec, tmp_path / "passkey.png", "passkey")
    assert log_to_run_wandb(run_dir, cfg, rec, png) is None  # logger.wandb.mode=disabled: nothing
    cfg.logger.wandb.mode = "offline"
    assert log_to_run_wandb(run_dir, cfg, rec, png) is None  # never logged to wandb (no wandb_id): nothing
    (run_dir / "wandb_id").write_text("evaltest\n")
    where = Path(log_to_run_wandb(run_dir, cfg, rec, png))
    assert where.parent == run_dir / "wandb" and where.name.endswith("-evaltest")  # offline-run-<time>-<id>
    assert any(where.glob("*.wandb"))


def test_retrieval_without_the_tokenizer_uses_ids(monkeypatch, capsys):
    """tiktoken fetches its tables on first use: offline, the prompts are made of ids (and a note says so)."""
    import longctx.evaluate as evaluate_module

    def offline(cfg, run_dir):
        raise ValueError("--prompt: the run's tokenizer (tiktoken GPT-2) could not load its vocabulary "
                         "(ConnectionError); set TIKTOKEN_CACHE_DIR to a tiktoken cache or give --prompt-ids")

    monkeypatch.setattr(evaluate_module, "run_codec", offline)
    assert evaluate_module.text_codec_of(None, None) is None
    err = capsys.readouterr().err
    assert "the data's tokenizer is unavailable (ValueError: the run's tokenizer (tiktoken GPT-2) could not load its " \
           "vocabulary (ConnectionError)" in err and "id alphabet" in err and "--prompt" not in err


def test_ctrl_c_is_one_line_and_writes_nothing(run, tmp_path, capsys, monkeypatch):
    import longctx.evaluate as evaluate_module

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "run_command", interrupted)
    assert evaluate_main([str(run), "--device", "cpu", "--out", str(tmp_path / "x.json")]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["interrupted by Ctrl-C before the result was written"]
    assert not (tmp_path / "x.json").exists()


def test_a_dataset_replaced_under_the_runs_path_is_refused_unless_named(train_run, tiny_overrides, tmp_path, capsys,
                                                                         make_corpus):
    """The run's dataset prepared again at its path (another seed: other heldout documents): evaluate refuses to
    label those as the run's data, naming both digests; naming the data (data.path=...) evaluates it knowingly."""
    from longctx.data.prepare import PrepareConfig, prepare_dataset

    corpus = make_corpus(tmp_path / "corpus")
    data = tmp_path / "ds"

    def prepare(seed, overwrite=False):
        prepare_dataset(PrepareConfig(source=str(corpus), out=str(data), doc_len=128, heldout_docs=4, seed=seed,
                                      tokenizer="bytes", overwrite=overwrite, progress=False))
    prepare(0)
    generic = [o for o in tiny_overrides if not o.startswith(("data.eval_docs", "data.train_tokens", "data.n_heldout"))]
    run = train_run(tmp_path / "run", [*generic, "trainer.max_steps=3", "data=longcrawl64", f"data.path={data}",
                                       "data.eval_docs=4", "data.docs_per_batch=4"])
    args = [str(run), "--device", "cpu", "--out"]
    assert evaluate_main([*args, str(tmp_path / "a.json")]) == 0
    prepare(1, overwrite=True)
    assert evaluate_main([*args, str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: data: {data / 'heldout.zarr'} holds other heldout documents (digest ") and \
        err.endswith(f"the dataset was replaced; to evaluate on it anyway, name it: data.path={data}"), err
    assert not (tmp_path / "b.json").exists()
    assert evaluate_main([*args, str(tmp_path / "c.json"), f"data.path={data}"]) == 0
