"""trainer.init_from=<Hugging Face folder>: a transformers checkpoint (config.json + safetensors) mapped onto
arch=gpt2 (learned positions, tanh GELU) or arch=llama (GQA, Qwen2's qkv biases). The truth is transformers' own
model: with attention=exp the imported model computes its logits; with another attention it trains from its
weights. Bad folders fail in one line naming the field. arch=llama's grouped-query attention also decodes and runs
packed documents as its full forward does (the registry's own llama cases run in the slow suite)."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from longctx.hf.import_weights import load_checkpoint, main, overrides  # noqa: E402
from longctx.models import build_model, model_spec  # noqa: E402
from longctx.train.trainer import Trainer  # noqa: E402

DATA_VOCAB = 5  # the default ICL Markov data: 4 states + BOS


def hf_model(kind: str, vocab: int = DATA_VOCAB):
    """A small random transformers model of `kind`, weights N(0, 0.3) so every path moves the logits."""
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=128, attn_implementation="eager"))
    elif kind == "llama":  # grouped-query attention: 2 key/value heads for 4 query heads; untied head
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_theta=500.0, attn_implementation="eager"))
    else:  # qwen2: biases on q, k, v, one key/value head, tied embeddings
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=vocab, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, tie_word_embeddings=True, attn_implementation="eager"))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.float().eval()


def saved(model, folder, **kw):
    model.save_pretrained(folder, **kw)  # safetensors
    return folder


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_imported_model_computes_the_checkpoints_logits(kind, compose, tmp_path):
    """attention=exp: the model the run's config builds (the printed overrides), with the folder's weights, gives
    transformers' logits to fp32 round-off; llama's folder is sharded (model.safetensors.index.json)."""
    model = hf_model(kind)
    folder = saved(model, tmp_path / kind, **({"max_shard_size": "20KB"} if kind == "llama" else {}))
    assert (folder / "model.safetensors.index.json").exists() == (kind == "llama")
    cfg = compose(*overrides(folder), "ctx=64")
    ours = build_model(model_spec(cfg, DATA_VOCAB)).eval()
    assert load_checkpoint(ours, folder) == []  # every tensor of the model came from the checkpoint
    ids = torch.randint(0, DATA_VOCAB, (3, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).logits, ours(ids)
    assert want.std() > 0.1  # logits that differ across tokens and positions: a wrong mapping shows
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def mapped_pairs(kind: str, hf: dict) -> list[tuple[str, torch.Tensor]]:
    """(longctx name, the checkpoint tensor it must equal) for a few tensors of each kind, written out by hand."""
    if kind == "gpt2":
        return [("wte.weight", hf["transformer.wte.weight"]), ("wpe.weight", hf["transformer.wpe.weight"][:64]),
                ("blocks.1.attn.qkv.weight", hf["transformer.h.1.attn.c_attn.weight"].t()),
                ("blocks.0.mlp.proj.bias", hf["transformer.h.0.mlp.c_proj.bias"]),
                ("lm_head.weight", hf["transformer.wte.weight"])]
    return [("wte.weight", hf["model.embed_tokens.weight"]), ("lm_head.weight", hf["lm_head.weight"]),
            ("blocks.1.attn.k.weight", hf["model.layers.1.self_attn.k_proj.weight"]),
            ("blocks.0.mlp.gate.weight", hf["model.layers.0.mlp.gate_proj.weight"]),
            ("blocks.1.mlp_norm.weight", hf["model.layers.1.post_attention_layernorm.weight"])]


@pytest.mark.parametrize("kind, attention", [
    pytest.param("llama", ["attention=power", "p=2"], id="llama-power2"),
    pytest.param("gpt2", ["attention=window", "window=16"], id="gpt2-window16", marks=pytest.mark.slow)])
def test_trainer_starts_from_a_hugging_face_folder_and_trains(kind, attention, compose, tiny, tmp_path):
    """The real trainer with trainer.init_from=<folder> and another attention: at step 0 the mapped weights are the
    checkpoint's and the core's own parameters (power's gate) their documented init; the model's vocabulary is
    the checkpoint's (8 rows for 5 data tokens: padding); four steps give finite, falling training losses; a run
    from that run's weights builds the same model."""
    vocab = 8 if kind == "llama" else DATA_VOCAB
    model = hf_model(kind, vocab)
    folder = saved(model, tmp_path / kind)
    run = tmp_path / "run"
    trainer = Trainer(compose(*tiny, *overrides(folder), *attention, f"trainer.init_from={folder}",
                              "trainer.max_steps=4", "trainer.eval_every=2", f"run_dir={run}"))
    assert trainer.spec.vocab_size == vocab and trainer.step == 0
    state, hf = trainer.model.state_dict(), model.state_dict()  # transformers' own tensors
    for name, want in mapped_pairs(kind, hf):
        assert torch.equal(state[name], want), name
    if kind == "llama":
        gates = [v for k, v in state.items() if k.endswith("core.gate.bias")]
        assert len(gates) == 2 and all(torch.equal(g, torch.full((4,), 6.9)) for g in gates)
    trainer.fit()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train, heldout = ([r[key] for r in records if key in r] for key in ("train_loss", "heldout_loss"))
    assert len(train) == len(heldout) == 2 and torch.isfinite(torch.tensor(train + heldout)).all()
    assert train[-1] < train[0], train  # steps 3-4 below steps 1-2
    # a run from that run's weights keeps the checkpoint's vocabulary (its source's source is the folder)
    after = Trainer(compose(*tiny, *overrides(folder), *attention, f"trainer.init_from={run}",
                            f"run_dir={tmp_path / 'next'}"))
    assert after.spec.vocab_size == vocab
    assert all(torch.equal(v, trainer.model.state_dict()[k]) for k, v in after.model.state_dict().items())


def bad_folder(tmp_path, what: str):
    folder = saved(hf_model("gpt2" if what == "ctx" else "llama"), tmp_path / "hf")
    if what in ("model_type", "hidden_size", "longctx_export"):
        config = json.loads((folder / "config.json").read_text())
        bad = {"model_type": "mamba"} if what == "model_type" else {"hidden_size": "32"} if what == "hidden_size" \
            else {"model_type": "longctx"}
        (folder / "config.json").write_text(json.dumps(config | bad))
    elif what == "safetensors":
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    elif what == "vocab":
        return saved(hf_model("llama", vocab=4), tmp_path / "small_vocab")
    return folder


@pytest.mark.parametrize("what, extra, message", [
    pytest.param(*case, id=case[0]) for case in [
        ("model_type", [], r"config\.json: model_type='mamba' cannot be imported; supported: gpt2, llama, qwen2$"),
        ("longctx_export", [], r"config\.json: model_type='longctx' is an export of a longctx run, not a model to "
                               r"import; give trainer\.init_from the run folder or a checkpoint it was exported from"),
        ("hidden_size", [], r"config\.json hidden_size='32': must be a positive integer \(model_type=llama\)$"),
        ("d_model", ["model.d_model=64"], r"the checkpoint \(config\.json hidden_size=32\) needs model\.d_model=32, "
                                          r"the run has model\.d_model=64; build the checkpoint's model"),
        ("n_layers", ["model.n_layers=3"], r"\(config\.json num_hidden_layers=2\) needs model\.n_layers=2, "
                                           r"the run has model\.n_layers=3; "),
        ("rope_dims", ["arch.rope_dims=4"], r"\(config\.json head_dim=8\) needs arch\.rope_dims=8, the run has "
                                            r"arch\.rope_dims=4; "),
        ("n_kv_heads", ["arch.n_kv_heads=4"], r"\(config\.json num_key_value_heads=2\) needs arch\.n_kv_heads=2, "
                                              r"the run has arch\.n_kv_heads=4; "),
        ("safetensors", [], r"holds no model\.safetensors nor model\.safetensors\.index\.json \(pytorch_model\.bin: "
                            r"pickles, never loaded"),
        ("vocab", [], r"the data's vocabulary \(5 tokens\) is larger than the checkpoint's \(config\.json "
                      r"vocab_size=4\)"),
        ("ctx", ["ctx=256"], r"ctx=256: the checkpoint's learned positions end at n_positions=128$"),
    ]])
def test_a_folder_that_does_not_fit_fails_in_one_line(what, extra, message, compose, tiny, tmp_path):
    """Before anything is written to the run directory."""
    folder = bad_folder(tmp_path, what)
    base = overrides(bad_folder(tmp_path / "good", "")) if what in ("model_type", "hidden_size", "longctx_export") \
        else overrides(folder)
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=message) as err:
        Trainer(compose(*tiny, *base, *extra, f"trainer.init_from={folder}", f"run_dir={run}"))
    assert "\n" not in str(err.value)
    assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()


def test_overrides_command(tmp_path, capsys):
    """python -m longctx.hf.import_weights <folder> prints what builds the folder's model; a bad folder: one line."""
    folder = saved(hf_model("qwen2"), tmp_path / "qwen2")
    assert main([str(folder)]) == 0
    assert capsys.readouterr().out.split() == [
        "arch=llama", "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "arch.n_kv_heads=1", "arch.d_ff=40",
        "arch.norm_eps=1e-06", "arch.qkv_bias=true", f"trainer.init_from={folder}"]
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'config.json'}: not a readable JSON config")


@pytest.mark.parametrize("attention", [dict(attention="exp"), dict(attention="power", attention_params={"p": 2})],
                         ids=["exp", "power2"])
def test_grouped_query_decoding_equals_the_full_forward(attention):
    """arch=llama with 2 key/value heads for 4 query heads: a prompt, then one token at a time through the decoding
    caches, gives the logits of one forward over the whole sequence."""
    from longctx.models import ModelSpec

    torch.manual_seed(0)
    spec = ModelSpec(arch="llama", vocab_size=11, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ctx=32,
                     qkv_bias=True, **attention)
    model = build_model(spec).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        ids = torch.randint(0, 11, (2, 20))
        full = model(ids)
        cache = model.new_cache()
        steps = [model(ids[:, :12], cache=cache)] + [model(ids[:, i:i + 1], cache=cache) for i in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention, params", [("exp", {}), ("power", {"p": 2, "chunk_size": 4})],
                         ids=["exp", "power2"])
def test_grouped_query_packed_documents_run_as_if_alone(attention, params, monkeypatch):
    """arch=llama, GQA, float64: with doc_ids, each packed document's logits are those of the document run alone
    (rotary positions restart, attention and state stay within it). The power reference's normalizer guard is set
    to 0: with it, outputs differ at the 1e-6 level between where states start."""
    from longctx.kernels.power import reference
    from longctx.models import ModelSpec

    monkeypatch.setattr(reference, "EPS", 0.0)

    torch.manual_seed(0)
    spec = ModelSpec(arch="llama", attention=attention, attention_params=params, vocab_size=11, d_model=32,
                     n_layers=2, n_heads=4, n_kv_heads=2, ctx=32)
    model = build_model(spec).double().eval()
    ids = torch.randint(0, 11, (1, 23))
    doc_ids = torch.tensor([[0] * 9 + [1] * 14])
    with torch.no_grad():
        packed = model(ids, doc_ids=doc_ids)
        alone = torch.cat([model(ids[:, :9]), model(ids[:, 9:])], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-9, rtol=1e-9)


def test_conversion_recipe_builds_the_checkpoints_model_with_power_attention(compose, tmp_path):
    """experiment=convert_continue with the printed overrides: the checkpoint's model, power p=2, at ctx 8192, a new
    schedule warming up to a lower peak; config.json agrees with the spec it builds."""
    from longctx.hf.import_weights import check_spec
    from longctx.train.config import validate

    folder = saved(hf_model("qwen2"), tmp_path / "qwen2")
    cfg = compose("experiment=convert_continue", *overrides(folder), f"trainer.init_from={folder}",
                  f"data.path={tmp_path}", "run_dir=unused")
    validate(cfg, for_run=True)
    spec = model_spec(cfg, DATA_VOCAB)
    assert (spec.arch, spec.attention, spec.attention_params["p"], spec.ctx) == ("llama", "power", 2, 8192)
    assert (spec.n_kv_heads, spec.qkv_bias, cfg.optim.lr, cfg.optim.warmup_steps) == (1, True, 1e-4, 200)
    check_spec(spec, folder)
