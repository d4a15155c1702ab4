"""`python -m longctx.export RUN --out DIR`: every architecture x attention at tiny size loads in transformers
(remote code, and the Auto classes longctx registers) with longctx's own logits; transformers' greedy `generate`
continues the model's decoding states (one new token per forward, the LongctxCache of per-layer LayerCaches) and
gives longctx's tokens; the run's tokenizer travels (BPE, bytes); bad input is one line. The truth is the run's
model as longctx.runs.load_run gives it."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import longctx.export as export_cli  # noqa: E402
from longctx.hf.export import ExportError, byte_tokenizer, export_run  # noqa: E402
from longctx.hf.modeling import LongctxCache  # noqa: E402
from longctx.models import ARCHITECTURES, build_model, model_spec  # noqa: E402
from longctx.models.decoding import LayerCache  # noqa: E402
from longctx.runs import load_run  # noqa: E402
from longctx.train import checkpoint as ckpt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARCHS = tuple(sorted(ARCHITECTURES))  # every registered architecture: export knows none by name
ATTENTIONS = ("exp", "linear", "power", "window")
VOCAB = 64


def compose(cache_dir: Path, *overrides: str):
    from hydra import compose as hydra_compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=[f"cache_dir={cache_dir}", *overrides])


def random_run(root: Path, arch: str, attention: str) -> Path:
    """A run folder as the trainer leaves it (config.yaml, a checkpoint written by save_checkpoint), holding a tiny
    model with weights N(0, 0.3) (large enough that greedy decoding does not repeat one token)."""
    from omegaconf import OmegaConf
    extra = ["attention.window=8"] if attention == "window" else []  # shorter than the prompts: the window rolls
    cfg = compose(root / "cache", f"arch={arch}", f"attention={attention}", "model.d_model=32", "model.n_layers=2",
                  "model.n_heads=2", "ctx=64", f"run_dir={root}", *extra)
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, VOCAB))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    plain = OmegaConf.to_container(cfg, resolve=True)
    ckpt.save_checkpoint(root, 7, {"schema_version": ckpt.SCHEMA_VERSION, "model": model.state_dict(),
                                   "config": plain, "spec": dataclasses.asdict(model.spec)}, keep=2)
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """exported(arch, attention) -> (run_dir, export folder), each made once for the module."""
    made = {}

    def get(arch: str, attention: str):
        if (arch, attention) not in made:
            root = tmp_path_factory.mktemp(f"{arch}_{attention}")
            run = random_run(root / "run", arch, attention)
            made[arch, attention] = run, export_run(run, root / "hf")
        return made[arch, attention]
    return get


def ids(b: int, t: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def loaded(exported):
    """loaded(arch, attention) -> (transformers' model from the exported folder, the run's model from load_run)."""
    made = {}

    def get(arch: str, attention: str):
        if (arch, attention) not in made:
            run, folder = exported(arch, attention)
            hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
            made[arch, attention] = hf, load_run(run, device="cpu")[0]
        return made[arch, attention]
    return get


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_are_longctxs(exported, loaded, arch, attention):
    _, folder = exported(arch, attention)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "configuration_longctx.py",
                                                        "model.safetensors", "modeling_longctx.py"]
    hf, ours = loaded(arch, attention)
    assert type(hf).__name__ == "LongctxForCausalLM"
    x = ids(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), rtol=1e-5, atol=1e-5)


# every cache kind in the default suite (GPT-2's four, RWKV-7's own rule); the rest in the slow one (RWKV-7 with
# attention cores decodes slowly on CPU)
FAST = {("gpt2", a) for a in ATTENTIONS} | {("rwkv7", "linear")}


@pytest.mark.parametrize("arch, attention", [
    pytest.param(a, b, marks=() if (a, b) in FAST else pytest.mark.slow) for a in ARCHS for b in ATTENTIONS])
def test_greedy_generate_continues_longctxs_states(loaded, arch, attention):
    hf, ours = loaded(arch, attention)
    lengths = []  # the tokens each forward of generate feeds the longctx model
    hook = hf.model.register_forward_pre_hook(lambda module, args: lengths.append(args[0].shape[1]))
    prompt, new = ids(1, 10, seed=2), 6
    try:
        out = hf.generate(prompt, max_new_tokens=new, do_sample=False, use_cache=True, return_dict_in_generate=True,
                          output_logits=True)
    finally:
        hook.remove()
    expected = ours.generate(prompt, new, temperature=0)
    assert out.sequences.tolist() == expected.tolist()
    with torch.no_grad():  # every step's logits are those of the whole sequence so far, recomputed by longctx
        recomputed = ours(out.sequences)[0, 9:-1]
    torch.testing.assert_close(torch.cat(out.logits), recomputed, rtol=1e-4, atol=1e-4)
    assert lengths == [10] + [1] * (new - 1)          # the prompt once, then one token a step: the cache is used
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    assert isinstance(cache, LongctxCache) and len(cache) == 2
    assert all(isinstance(layer, LayerCache) and layer.pos == 10 + new - 1 for layer in cache.layer_caches)


def test_registered_auto_classes_load_without_remote_code(exported, tmp_path):
    import longctx.hf  # registers model_type "longctx" with the Auto classes
    assert transformers.AutoConfig.for_model("longctx").__class__ is longctx.hf.LongctxConfig

    run, folder = exported("gpt2", "power")
    local = tmp_path / "local"
    shutil.copytree(folder, local)
    for name in ("configuration_longctx.py", "modeling_longctx.py"):
        (local / name).unlink()  # only the registered classes can load it now
    hf = transformers.AutoModelForCausalLM.from_pretrained(local, trust_remote_code=False).eval()
    assert transformers.AutoConfig.from_pretrained(local).model_type == "longctx"
    ours, _ = load_run(run, device="cpu")
    x = ids(1, 16, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), rtol=1e-5, atol=1e-5)
    assert hf.model.lm_head.weight is hf.model.wte.weight  # stored once, tied again on load


def test_a_folder_missing_weights_is_refused_naming_one(exported, tmp_path):
    """A tensor cut from model.safetensors: refused in one line, not loaded as uninitialised memory (NaN logits)."""
    from safetensors.torch import load_file, save_file
    _, folder = exported("gpt2", "power")
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    tensors = load_file(str(cut / "model.safetensors"))
    gone = sorted(k for k in tensors if k.endswith(".weight") and ".blocks.1." in k)[0]
    del tensors[gone]
    save_file(tensors, str(cut / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as caught:
        transformers.AutoModelForCausalLM.from_pretrained(cut, trust_remote_code=True)
    assert str(caught.value) == (f"{cut}: its weights lack 1 of the model's tensors, the first {gone} (a damaged or "
                                 f"partial export); export the run again")
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                                 output_loading_info=True)
    assert not info["missing_keys"] and hf.model.lm_head.weight is hf.model.wte.weight   # a whole export loads


def test_tied_weights_are_stored_once(exported):
    from safetensors import safe_open
    _, folder = exported("gpt2", "power")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.wte.weight" in names and "model.lm_head.weight" not in names
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is True


def test_model_card_names_the_run_its_data_and_metrics(exported, tmp_path):
    run, _ = exported("gpt2", "linear")
    copy = tmp_path / "run_with_metrics"
    shutil.copytree(run, copy)
    (copy / "metrics.jsonl").write_text(json.dumps({"step": 7, "best_context_loss": 1.2345, "icl_curve": []}) + "\n")
    card = (export_run(copy, tmp_path / "hf") / "README.md").read_text()
    assert "run_with_metrics" in card and "step 7" in card and "icl_markov" in card
    assert "| best_context_loss | 1.2345 |" in card
    assert "trust_remote_code=True" in card and "pip install longctx" in card
    # a later evaluation than the checkpoint: the card keeps the exported step's own metrics
    with open(copy / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 9, "best_context_loss": 0.5}) + "\n")
    card = (export_run(copy, tmp_path / "hf2") / "README.md").read_text()
    assert "| best_context_loss | 1.2345 |" in card and "0.5 |" not in card and "| step | 7 |" in card
    (copy / "metrics.jsonl").write_text(json.dumps({"step": 9, "best_context_loss": 0.5}) + "\n")
    card = (export_run(copy, tmp_path / "hf3") / "README.md").read_text()
    assert "The run recorded no evaluation of step 7." in card and "0.5 |" not in card


def test_a_runs_bpe_tokenizer_travels(exported, tmp_path):
    from longctx.data.tokenizer import EOT, BPETokenizer
    run, _ = exported("gpt2", "exp")
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    bpe = BPETokenizer.train(["the cat sat on the mat; the dog sat on the log"] * 20, vocab_size=VOCAB + 200)
    bpe.save(copy / "tokenizer.json")
    tok = transformers.AutoTokenizer.from_pretrained(export_run(copy, tmp_path / "hf"))
    text = "the cat sat on the log"
    assert tok(text)["input_ids"] == bpe.encode(text)
    assert tok.decode(bpe.encode(text)) == text and tok.eos_token == EOT and tok.eos_token_id == bpe.eot_id


def test_the_byte_tokenizer_is_longctxs_bytes(tmp_path):
    from longctx.data.tokenizer import ByteTokenizer
    tok = byte_tokenizer()
    tok.save_pretrained(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "héllo wörld, 你好 \t\n  ok"
    assert tok(text)["input_ids"] == ByteTokenizer().encode(text)
    assert tok.decode(ByteTokenizer().encode(text)) == text and tok.eos_token_id == ByteTokenizer.eot_id == 256


def test_refusals_are_one_line(exported, tmp_path, capsys):
    run, folder = exported("gpt2", "power")
    before = sorted(p.name for p in folder.iterdir())
    cases = [([str(run), "--out", str(folder)], "exists and is not an empty folder"),
             ([str(tmp_path / "nowhere"), "--out", str(tmp_path / "a")], "does not exist"),
             ([str(tmp_path), "--out", str(tmp_path / "b")], "holds no checkpoint"),
             ([str(run), "--out", str(tmp_path / "c"), "--step", "3"], "step=3: ")]
    for argv, words in cases:
        assert export_cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert sorted(p.name for p in folder.iterdir()) == before
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp folder left behind
    with pytest.raises(ExportError):
        export_run(run, folder)


def test_cli_exports(exported, tmp_path, capsys):
    run, _ = exported("gpt2", "window")
    (tmp_path / "empty").mkdir()  # an empty folder may receive it
    assert export_cli.main([str(run), "--out", str(tmp_path / "empty"), "--step", "7"]) == 0
    out = capsys.readouterr().out
    assert "tokenizer: none" in out and f"exported {run} to {tmp_path / 'empty'}" in out
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_a_relative_out_is_printed_as_the_absolute_folder_written(exported, tmp_path, capsys, monkeypatch):
    run, _ = exported("gpt2", "exp")
    monkeypatch.chdir(tmp_path)
    assert export_cli.main([str(run), "--out", "hf/rel"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"exported {run} to {tmp_path / 'hf' / 'rel'}")
    assert (tmp_path / "hf" / "rel" / "model.safetensors").is_file()


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    from longctx.hf.configuration import require
    monkeypatch.setitem(__import__("sys").modules, "safetensors", None)  # as if not installed
    with pytest.raises(ImportError) as caught:
        require("transformers", "safetensors", what="longctx.export")
    assert str(caught.value) == ("longctx.export needs the optional package 'safetensors', which is not installed: "
                                 "pip install 'longctx[hf]'")


@pytest.mark.parametrize("command", [["longctx.hf.import_weights", "x"], ["longctx.hf.harness", "x", "--out", "y"],
                                     ["longctx.export", "x", "--out", "y"]])
def test_every_hf_command_without_the_extra_is_one_line(command, tmp_path):
    """transformers not installed (a sitecustomize hides it): each `python -m` command of the extra says so in one
    line and exits 2, the package's own modules too (their package's import fails before their main runs)."""
    import subprocess
    import sys
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['transformers'] = None\n")
    proc = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "needs the optional package 'transformers', which is not installed: pip install 'longctx[hf]'"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_from_a_hugging_face_folder_without_the_extra_is_one_line(tmp_path):
    import subprocess
    import sys
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['transformers'] = None\n")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), f"trainer.init_from={tmp_path / 'hf'}",
                           f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        f"error: trainer.init_from={tmp_path / 'hf'}: a Hugging Face folder; longctx.hf needs the optional package "
        f"'transformers', which is not installed: pip install 'longctx[hf]'"], proc.stderr
    assert not (tmp_path / "run").exists()


def recorded(tokenizer: str, bos_id: int) -> dict:
    """A run's record of its ids (longctx.generate.recorded_tokens) for a run of a text dataset, keeping no file."""
    return {"tokenizer": tokenizer, "bos_id": bos_id, "generator": None, "file": None}


def test_gpt2s_tokenizer_travels_where_its_files_are_here_and_is_said_missing_elsewhere(exported, monkeypatch):
    import longctx.generate
    from longctx.hf.export import run_tokenizer
    run, _ = exported("gpt2", "exp")
    gpt2 = recorded("tiktoken-gpt2", 50256)  # a LongCrawl64 run
    monkeypatch.setattr(longctx.generate, "recorded_tokens", lambda run_dir: gpt2)
    tok, note = run_tokenizer(run, None)
    if tok is None:  # GPT-2's files are not in this machine's Hugging Face cache (an export never downloads)
        assert note.startswith("GPT-2's (tiktoken gpt2), not included: its files were not on the exporting machine")
    else:
        import tiktoken
        text = "Long context language models"
        assert tok(text)["input_ids"] == tiktoken.get_encoding("gpt2").encode_ordinary(text)


def test_a_byte_runs_tokenizer_is_the_byte_tokenizer(exported, monkeypatch):
    import longctx.generate
    from longctx.hf.export import run_tokenizer
    run, _ = exported("gpt2", "exp")
    monkeypatch.setattr(longctx.generate, "recorded_tokens", lambda run_dir: recorded("bytes", 256))
    tok, note = run_tokenizer(run, None)
    assert tok("ok")["input_ids"] == [111, 107] and tok.eos_token_id == 256 and note.startswith("UTF-8 bytes")


@pytest.mark.slow
def test_remote_code_without_longctx_names_the_package(exported):
    """A machine without longctx: transformers checks the remote code's imports and names the package (one line)."""
    import subprocess
    import sys
    _, folder = exported("gpt2", "power")
    script = (
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'longctx':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from transformers import AutoModelForCausalLM\n"
        f"AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: This modeling file requires the following packages that were not found in your environment: "
        "longctx. Run `pip install longctx`")


def test_inputs_longctx_cannot_honour_are_refused_in_one_line(loaded):
    hf, ours = loaded("gpt2", "window")
    x = ids(2, 8, seed=3)
    right = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    with torch.no_grad():  # right padding: a causal model's real positions never see the pads after them
        torch.testing.assert_close(hf(x, attention_mask=right).logits[1, :5], ours(x[1:, :5])[0], rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(hf(x, position_ids=torch.arange(8)[None]).logits, ours(x), rtol=1e-5, atol=1e-5)
    for kwargs, words in [({"attention_mask": right.flip(1)}, "attention_mask: padding other than on the right"),
                          ({"attention_mask": right, "use_cache": True}, "attention_mask: padding other than"),
                          ({"position_ids": torch.arange(1, 9)[None]}, "position_ids: only positions 0..7"),
                          ({"output_hidden_states": True}, "output_hidden_states=True: not supported")]:
        with pytest.raises(ValueError) as caught:
            hf(x, **kwargs)
        assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


@pytest.mark.parametrize("arch, attention", [("gpt2", "exp"), ("gpt2", "linear"),
                                             pytest.param("rwkv7", "linear", marks=pytest.mark.slow)])
def test_beam_search_reorders_the_states_as_recomputation_would(loaded, arch, attention):
    """Beam search reorders the batch each step (LongctxCache.reorder_cache over every layer's state): the same beams
    as beam search recomputing the whole prefix each step (use_cache=False)."""
    hf, _ = loaded(arch, attention)
    x = ids(2, 10, seed=4)
    cached = hf.generate(x, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=True)
    recomputed = hf.generate(x, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=False)
    assert cached.tolist() == recomputed.tolist()
    if attention == "linear":  # beams that greedy decoding does not find: the reordering mattered
        assert cached.tolist() != hf.generate(x, max_new_tokens=6, do_sample=False).tolist()
