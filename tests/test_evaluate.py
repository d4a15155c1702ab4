"""Trained checkpoints put to use: load_run (old configs included), `python -m longctx.evaluate` at other context
lengths and data, `python -m longctx.generate`, and their one-line errors. One tiny power-attention run is
trained once for the module (CPU, a few seconds)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from longctx import load_run
from longctx.data import heldout_batch
from longctx.evaluate import main as evaluate_main
from longctx.generate import main as generate_main
from longctx.train import checkpoint as ckpt
from longctx.train.metrics import MIN_BEST_BIN_POSITIONS, exponential_bins

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["trainer.max_steps=4", "trainer.eval_every=4", "logger.wandb.mode=disabled", "data.train_tokens=65536",
         "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
         "trainer.num_threads=2", "attention=power", "p=2", "attention.chunk_size=16"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "power", TRAIN)


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
    with pytest.raises(ValueError, match="holds no checkpoint"):
        load_run(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"step=3: .* has steps 4"):
        load_run(run, step=3)


# -- evaluate -----------------------------------------------------------------------------------------------

def test_evaluate_at_twice_the_training_context(run, tmp_path, capsys):
    out = tmp_path / "eval" / "ctx128.json"
    assert evaluate_main([str(run), "--ctx", "128", "--docs", "6", "--out", str(out), "--device", "cpu"]) == 0
    rec = json.loads(out.read_text())
    assert (rec["ctx"], rec["train_ctx"], rec["docs"], rec["step"]) == (128, 64, 6, 4)
    assert len(rec["per_position_loss"]) == 128
    assert rec["icl_curve"][0][0] == 0 and rec["icl_curve"][-1][1] == 128
    # best context: the lowest bin among those wide enough to trust
    trusted = [v for lo, hi, v in rec["icl_curve"] if hi - lo >= MIN_BEST_BIN_POSITIONS]
    assert rec["best_context_loss"] == min(trusted)
    assert [b[:2] for b in rec["bayes_curve"]] == [b[:2] for b in rec["icl_curve"]]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "best-context loss" in capsys.readouterr().out
    # independent truth: cross-entropy of the model's logits on the same heldout documents
    model, cfg = load_run(run, device="cpu")
    data = heldout_batch(rec["data"]["heldout"], 128, 6)
    with torch.no_grad():
        logits = model(data["inputs"])
    nll = F.cross_entropy(logits.transpose(1, 2), data["targets"], reduction="none").double().mean(0)
    torch.testing.assert_close(torch.tensor(rec["per_position_loss"], dtype=torch.float64), nll, rtol=0, atol=2e-5)
    last10 = nll[-13:].mean().item()  # ceil(10% of 128) = 13 positions
    assert rec["last10_loss"] == pytest.approx(last10, abs=1e-5)


def test_evaluate_cli_runs_shorter_than_training(run, tmp_path):
    out = tmp_path / "ctx32.json"
    proc = cli("longctx.evaluate", run, "--ctx", 32, "--out", out, "--device", "cpu", "--bins", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rec = json.loads(out.read_text())
    assert rec["ctx"] == 32 and [b[:2] for b in rec["icl_curve"]] == [list(b) for b in exponential_bins(32, 4)]


@pytest.mark.parametrize("case", ["missing run", "no checkpoints", "unknown attention", "ctx beyond documents",
                                  "data vocabulary too large", "unknown data key"])
def test_evaluate_bad_input_is_one_line(run, tmp_path, capsys, case):
    run_dir, extra, words = run, [], ""
    if case == "missing run":
        run_dir, words = tmp_path / "nowhere", "does not exist"
    elif case == "no checkpoints":
        run_dir, words = tmp_path / "fresh", "holds no checkpoint"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text((run / "config.yaml").read_text())
    elif case == "unknown attention":
        run_dir, words = tmp_path / "renamed", "attention.name='flash': unknown attention; known: exp, linear, power"
        (run_dir / "checkpoints").mkdir(parents=True)
        state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run)[1])
        state["config"]["attention"]["name"] = "flash"
        torch.save(state, run_dir / "checkpoints" / "step_00000004.pt")
    elif case == "ctx beyond documents":
        extra, words = ["--ctx", "512"], "ctx=512 is larger than the documents"
    elif case == "data vocabulary too large":
        extra, words = ["data.vocab=9"], "data vocabulary 10"
    elif case == "unknown data key":
        extra, words = ["data.vocabb=9"], "data.vocabb: not a key of the icl_markov data config"
    args = [str(run_dir), "--out", str(tmp_path / "x.json"), "--device", "cpu", "--docs", "2"]
    args += extra if "--ctx" in extra else ["--ctx", "128", *extra]
    one_error_line(capsys, evaluate_main(args), words)
    assert not (tmp_path / "x.json").exists()


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
    (["--prompt-ids", "1", "--top-k", "0"], "top_k"),
])
def test_generate_bad_input_is_one_line(run, capsys, args, words):
    code = generate_main([str(run), "--max-new-tokens", "3", "--device", "cpu", *args])
    one_error_line(capsys, code, words)


def test_generate_missing_run_is_one_line(tmp_path):
    proc = cli("longctx.generate", tmp_path / "nowhere", "--max-new-tokens", 3, "--prompt-ids", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: run directory '{tmp_path / 'nowhere'}' does not exist"]
