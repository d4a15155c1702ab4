"""`python -m longctx.generate` on a tiny trained run (CPU): the default static decoder, the eager cached path and
recomputation print the same greedy ids; --prompt-ids loads no tokenizer; --max-new-tokens has a default; a NaN
temperature is one line; a reader that stops early (`| head`) leaves no traceback; learned positions past the
model's ctx are the same one line on every decoding path."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import longctx.generate as generate_cli

REPO = Path(__file__).resolve().parents[1]
TRAIN = ["optim.warmup_steps=1",
         "trainer.max_steps=2", "trainer.eval_every=2", "logger.wandb.mode=disabled", "data.train_tokens=65536",
         "data.n_heldout=16", "data.eval_docs=8", "data.docs_per_batch=4", "data.doc_len=256", "ctx=64",
         "trainer.num_threads=2", "attention=power", "p=2", "attention.chunk_size=16"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, train_run):
    return train_run(tmp_path_factory.mktemp("runs") / "power", TRAIN)


@pytest.fixture(scope="module")
def learned(tmp_path_factory, train_run):
    """GPT-2 with learned positions: a table of ctx=64 positions."""
    return train_run(tmp_path_factory.mktemp("runs") / "learned",
                     [*TRAIN[:-3], "arch=gpt2", "attention=exp", "arch.positions=learned"])


def ids_printed(capsys) -> list[int]:
    ids_line, speed_line = capsys.readouterr().out.strip().splitlines()[-2:]
    assert "tokens/s" in speed_line
    return [int(i) for i in ids_line.split()]


def test_every_decoding_path_prints_the_same_greedy_ids(run, capsys, monkeypatch):
    monkeypatch.setattr(generate_cli, "run_codec", lambda *a: pytest.fail("--prompt-ids loaded a tokenizer"))
    outputs = {}
    for flags in ([], ["--no-static"], ["--no-cache"], ["--no-compile"]):
        code = generate_cli.main([str(run), "--prompt-ids", "4,0,1,2", "--temperature", "0", "--max-new-tokens", "20",
                                  "--device", "cpu", *flags])
        assert code == 0
        outputs[tuple(flags)] = ids_printed(capsys)
    assert outputs[()] == outputs[("--no-static",)] == outputs[("--no-cache",)] == outputs[("--no-compile",)]
    assert len(outputs[()]) == 20


def test_decoder_line_names_the_path(monkeypatch):
    """The speed line says which path decoded: on CUDA by default the compiled whole step, power's fused kernel and CUDA
    graphs; `--no-compile` leaves the compilation out; on CPU the static buffers alone."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert generate_cli.parse_args(["RUN"]).compile is None
    assert generate_cli.parse_args(["RUN", "--no-compile"]).compile is False
    assert generate_cli.parse_args(["RUN", "--compile"]).compile is True
    assert generate_cli.decoder_name(True, True, cpu, None) == "cached decoding, static buffers"
    monkeypatch.setattr(generate_cli, "compile_available", lambda device: torch.device(device).type == "cuda")
    assert generate_cli.decoder_name(True, True, cuda, None) == ("cached decoding, static buffers, compiled model "
                                                                 "step, CUDA graphs")
    assert generate_cli.decoder_name(True, True, cuda, False) == "cached decoding, static buffers, CUDA graphs"
    assert generate_cli.decoder_name(True, True, cuda, fused_state=True) == ("cached decoding, static buffers, compiled "
                                                                       "model step, fused power kernel, CUDA graphs")
    assert generate_cli.decoder_name(True, False, cuda) == "cached decoding, eager"
    assert generate_cli.decoder_name(False, True, cuda) == "recomputing the prefix"


def test_max_new_tokens_has_a_default(run, capsys):
    assert generate_cli.main([str(run), "--prompt-ids", "1,2", "--device", "cpu"]) == 0
    assert len(ids_printed(capsys)) == 100


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_bad_temperature_is_one_line(run, capsys, value):
    code = generate_cli.main([str(run), "--prompt-ids", "1", "--device", "cpu", "--temperature", value])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [f"error: --temperature={float(value)}: must be a finite number >= 0 "
                                                 f"(0 = greedy)"]


@pytest.mark.parametrize("args,message", [
    (["--prompt-ids", "1", "--top-k", "0"], "--top-k=0: must be a positive integer (leave it out to sample from every "
                                            "token)"),
    (["--prompt-ids", "1,,2"], "--prompt-ids='1,,2': expected comma-separated integers, e.g. 1,2,3"),
    (["--prompt-ids", "1,2,"], "--prompt-ids='1,2,': expected comma-separated integers, e.g. 1,2,3"),
])
def test_bad_sampling_flags_and_ids_are_one_line_naming_the_flag(run, capsys, args, message):
    code = generate_cli.main([str(run), *args, "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [f"error: {message}"]


def test_a_closed_pipe_leaves_no_traceback(run):
    proc = subprocess.run(f"{sys.executable} -m longctx.generate {run} --prompt-ids 1,2 --max-new-tokens 5 "
                          f"--device cpu | head -c 0", shell=True, capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr[-2000:]


PATHS = ([], ["--no-static"], ["--no-cache"], ["--no-compile"])


@pytest.mark.parametrize("flags", PATHS, ids=lambda f: " ".join(f) or "static")
def test_learned_positions_past_ctx_are_one_line_on_every_path(learned, capsys, flags):
    """A prompt of 4 tokens reads positions 0..3, each new token but the last one more: 61 new tokens reach
    position 63, the table's last; 62 would read position 64."""
    assert generate_cli.main([str(learned), "--prompt-ids", "1,2,3,0", "--max-new-tokens", "61", "--device", "cpu",
                              "--temperature", "0", *flags]) == 0
    assert len(ids_printed(capsys)) == 61
    code = generate_cli.main([str(learned), "--prompt-ids", "1,2,3,0", "--max-new-tokens", "62", "--device", "cpu",
                              *flags])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [
        "error: --max-new-tokens=62: a prompt of 4 tokens and 62 new ones need positions up to 65: "
        "arch.positions=learned holds ctx=64 positions; ask for at most 61"]


def test_the_python_generate_past_learned_positions_names_its_argument(learned):
    """model.generate refuses as the command does, naming its own arguments (not an IndexError of the table)."""
    from longctx.runs import load_run
    model = load_run(learned)[0]
    prompt = torch.tensor([[1, 2, 3, 0]])
    assert model.generate(prompt, 61, temperature=0).shape == (1, 65)
    with pytest.raises(ValueError) as caught:
        model.generate(prompt, 62, temperature=0)
    assert str(caught.value) == ("max_new_tokens=62: a prompt of 4 tokens and 62 new ones need positions up to 65: "
                                 "arch.positions=learned holds ctx=64 positions; ask for at most 61")
    with pytest.raises(ValueError, match=r"^idx: 65 tokens need positions up to 65: "):
        model.generate(torch.ones(1, 65, dtype=torch.long), 1)


def test_a_prompt_past_learned_positions_is_one_line(learned, capsys):
    code = generate_cli.main([str(learned), "--prompt-ids", ",".join(["1"] * 65), "--max-new-tokens", "1",
                              "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.strip().splitlines() == [
        "error: --prompt-ids: 65 tokens need positions up to 65: arch.positions=learned holds ctx=64 positions; give "
        "a shorter prompt"]
