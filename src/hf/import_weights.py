"""Hugging Face checkpoints as the start of a longctx run: `trainer.init_from=<folder>`.

A folder as `save_pretrained` writes it: `config.json` and `model.safetensors`, or shards listed in
`model.safetensors.index.json`. The config is read as JSON (no code of the folder runs) and the weights with
safetensors (no pickle). Supported `model_type`s and the architecture each maps onto (MODEL_TYPES):

    gpt2          arch=gpt2 arch.positions=learned arch.activation=gelu_tanh (GPT-2's own positions and GELU)
    llama, qwen2  arch=llama (qwen2: arch.qkv_bias=true)

The run's config must build the checkpoint's model (`python -m longctx.hf.import_weights <folder>` prints the
overrides that do); any attention core takes its place (`attention=power p=2`). What the checkpoint has no
counterpart for keeps its initialisation, as the core documents it: power/linear's gate starts near no forgetting
(sigmoid(6.9) ~ 0.999 per token), power's output norm at 1, exp's sink logit at 0. Only `attention=exp` (without
a sink) computes exactly the checkpoint's function; the others start from its projections and MLPs.

The model's vocabulary is the checkpoint's (embedding rows beyond the data's vocabulary are the checkpoint's
padding); data with a larger vocabulary is refused.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from longctx.train.checkpoint import first_non_finite

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MODEL_TYPES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "llama"}  # HF model_type -> longctx architecture


class HFImportError(ValueError):
    """A folder that does not map onto the run's model: one line naming the field (config.json's or ours)."""


def read_config(folder) -> dict:
    """config.json of `folder` as a dict, its model_type one we map."""
    path = Path(str(folder)).expanduser() / CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HFImportError(f"{path}: not a readable JSON config ({err})") from None
    if not isinstance(config, dict):
        raise HFImportError(f"{path}: expected a JSON object, found {type(config).__name__}")
    model_type = config.get("model_type")
    if model_type == "longctx":   # an export of a longctx run: its run folder or checkpoint is the source
        raise HFImportError(f"{path}: model_type='longctx' is an export of a longctx run, not a model to import; give "
                            f"trainer.init_from the run folder or a checkpoint it was exported from "
                            f"(checkpoints/step_*.pt or .safetensors)")
    if model_type not in MODEL_TYPES:
        raise HFImportError(f"{path}: model_type={model_type!r} cannot be imported; supported: "
                            f"{', '.join(sorted(MODEL_TYPES))}")
    return config


# ----------------------------------------------------------------------------------------------------------
# config.json -> the ModelSpec fields it fixes, each with the config.json key it comes from (for errors)

def _get(config: dict, key: str, default=None):
    value = config.get(key, default)
    return default if value is None else value


def _refuse(config: dict, key: str, value, why: str):
    raise HFImportError(f"config.json {key}={value!r}: {why} (model_type={config['model_type']})")


def checkpoint_fields(config: dict) -> dict[str, tuple]:
    """{ModelSpec field: (value, config.json key)} of the model the checkpoint is, for a config of MODEL_TYPES.
    Options longctx does not have are refused, naming the key."""
    for key in INT_KEYS[config["model_type"]]:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            _refuse(config, key, value, "must be a positive integer")
    return _gpt2_fields(config) if config["model_type"] == "gpt2" else _llama_fields(config)


_LLAMA_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "head_dim")
INT_KEYS = {"gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions"),
            "llama": _LLAMA_INTS, "qwen2": _LLAMA_INTS}


def _gpt2_fields(config: dict) -> dict[str, tuple]:
    d, heads = _get(config, "n_embd", 768), _get(config, "n_head", 12)
    inner = _get(config, "n_inner", 4 * d)
    act = _get(config, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        _refuse(config, "activation_function", act, "expected gelu_new, gelu_pytorch_tanh or gelu")
    if inner % d:
        _refuse(config, "n_inner", inner, f"must be a multiple of n_embd={d} (longctx's model.mlp_ratio)")
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("reorder_and_upcast_attn", False), ("tie_word_embeddings", True), ("add_cross_attention", False)):
        if _get(config, key, ok) is not ok:
            _refuse(config, key, config[key], f"longctx's GPT-2 has {str(ok).lower()}")
    eps = _get(config, "layer_norm_epsilon", 1e-5)
    if eps != 1e-5:  # nn.LayerNorm's default, which the GPT-2 blocks use
        _refuse(config, "layer_norm_epsilon", eps, "longctx's GPT-2 LayerNorms have 1e-5")
    return {"arch": ("gpt2", "model_type"), "vocab_size": (_get(config, "vocab_size", 50257), "vocab_size"),
            "d_model": (d, "n_embd"), "n_layers": (_get(config, "n_layer", 12), "n_layer"),
            "n_heads": (heads, "n_head"), "mlp_ratio": (inner // d, "n_inner"),
            "positions": ("learned", "model_type"), "token_shift": (False, "model_type"),
            "activation": ("gelu" if act == "gelu" else "gelu_tanh", "activation_function")}


def _llama_fields(config: dict) -> dict[str, tuple]:
    d, heads = _get(config, "hidden_size", 4096), _get(config, "num_attention_heads", 32)
    head_dim = _get(config, "head_dim", d // heads)
    if head_dim * heads != d:
        _refuse(config, "head_dim", head_dim, f"longctx's heads split hidden_size={d} into "
                                              f"num_attention_heads={heads} (head_dim {d // heads})")
    act = _get(config, "hidden_act", "silu")
    if act != "silu":
        _refuse(config, "hidden_act", act, "longctx's Llama MLP is SwiGLU (silu)")
    # transformers >= 5 writes rope_parameters (rope_type, rope_theta); earlier versions rope_theta and rope_scaling
    rope = config.get("rope_parameters") or {}
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key) or {}
        kind = value.get("rope_type", value.get("type", "default")) if isinstance(value, dict) else value
        if kind != "default":
            _refuse(config, key, value, "only plain rotary positions are implemented (no scaling)")
    qwen2 = config["model_type"] == "qwen2"
    if qwen2 and _get(config, "use_sliding_window", False):
        _refuse(config, "use_sliding_window", True, "longctx's Llama attends to the whole context")
    for key in ("attention_bias", "mlp_bias"):
        if _get(config, key, False):
            _refuse(config, key, True, "longctx's Llama has no biases (but arch.qkv_bias, Qwen2's)")
    theta = _get(config, "rope_theta", _get(rope, "rope_theta", 10000.0))
    return {"arch": ("llama", "model_type"), "vocab_size": (_get(config, "vocab_size", 32000), "vocab_size"),
            "d_model": (d, "hidden_size"), "n_layers": (_get(config, "num_hidden_layers", 32), "num_hidden_layers"),
            "n_heads": (heads, "num_attention_heads"),
            "n_kv_heads": (_get(config, "num_key_value_heads", heads), "num_key_value_heads"),
            "d_ff": (_get(config, "intermediate_size", 11008), "intermediate_size"),
            "norm_eps": (_get(config, "rms_norm_eps", 1e-6), "rms_norm_eps"),
            "rope_base": (float(theta), "rope_theta"), "rotary_dims": (head_dim, "head_dim"),
            "tie_embeddings": (bool(_get(config, "tie_word_embeddings", False)), "tie_word_embeddings"),
            "qkv_bias": (qwen2, "model_type")}


# The config key of each ModelSpec field (models.spec.SPEC_KEYS for the arch options), for errors and overrides
CONFIG_KEYS = {"arch": "arch", "d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
               "mlp_ratio": "model.mlp_ratio", "rope_base": "arch.rope_base", "rotary_dims": "arch.rope_dims",
               "token_shift": "arch.token_shift", "positions": "arch.positions",
               "activation": "arch.activation", "n_kv_heads": "arch.n_kv_heads", "d_ff": "arch.d_ff",
               "norm_eps": "arch.norm_eps", "tie_embeddings": "arch.tie_embeddings", "qkv_bias": "arch.qkv_bias"}


def overrides(folder) -> list[str]:
    """The command-line overrides that build the checkpoint's model, e.g. ['arch=llama', 'model.d_model=896', ...]."""
    from longctx.models.spec import DEFAULTS

    fields = checkpoint_fields(read_config(folder))
    out = []
    for name, key in CONFIG_KEYS.items():
        if name in fields:
            value = fields[name][0]
            # the arch's conf file has it already (rotary_dims: every head dim, the conf's rope_dims=null)
            if key.startswith("arch.") and (name not in DEFAULTS or value == DEFAULTS[name]):
                continue
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
            out.append(f"{key}={shown}")
    return out


def check_spec(spec, folder) -> dict:
    """The folder's config.json against `spec` (the run's model): the first field that differs raises one line
    naming both keys and values. Returns the config."""
    config = read_config(folder)
    for name, (value, key) in checkpoint_fields(config).items():
        ours = getattr(spec, name)
        same = math.isclose(ours, value, rel_tol=1e-9) if name in ("norm_eps", "rope_base") else ours == value
        if not same:
            ours_key = CONFIG_KEYS.get(name, "vocab_size (from the data)" if name == "vocab_size" else name)
            raise HFImportError(f"trainer.init_from={str(folder)!r}: the checkpoint (config.json "
                                f"{key}={config.get(key, value)!r}) needs {ours_key}={value!r}, the run has "
                                f"{ours_key}={ours!r}; build the checkpoint's model "
                                f"(python -m longctx.hf.import_weights {folder} prints its overrides)")
    positions = _get(config, "n_positions", 1024)
    if spec.arch == "gpt2" and spec.ctx > positions:
        raise HFImportError(f"ctx={spec.ctx}: the checkpoint's learned positions end at n_positions={positions}")
    return config


def checkpoint_vocab(folder, data_vocab: int) -> int:
    """The vocabulary of a model imported from `folder`: the checkpoint's, which must cover the data's."""
    config = read_config(folder)
    vocab = checkpoint_fields(config)["vocab_size"][0]
    if data_vocab > vocab:
        raise HFImportError(f"trainer.init_from={str(folder)!r}: the data's vocabulary ({data_vocab} tokens) is "
                            f"larger than the checkpoint's (config.json vocab_size={vocab}): tokenize the data with "
                            f"the checkpoint's tokenizer")
    return vocab


# ----------------------------------------------------------------------------------------------------------
# weights

def read_weights(folder) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors file(s), on the CPU, names as saved."""
    try:
        from safetensors import SafetensorError
        from safetensors.torch import load_file
    except ImportError:
        raise ImportError("trainer.init_from of a Hugging Face folder needs the package 'safetensors': "
                          "pip install 'longctx[hf]'") from None
    folder = Path(str(folder)).expanduser()
    if (folder / INDEX).is_file():
        try:
            weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise HFImportError(f"{folder / INDEX}: not a safetensors index ({type(err).__name__}: {err})") from None
    elif (folder / SINGLE).is_file():
        files = [SINGLE]
    else:
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        why = f" ({', '.join(sorted(pickled))}: pickles, never loaded; save with safe_serialization)" if pickled else ""
        raise HFImportError(f"trainer.init_from={str(folder)!r}: holds no {SINGLE} nor {INDEX}{why}")
    state = {}
    for name in files:
        path = folder / name
        if Path(name).name != name or not path.is_file():  # shard names stay inside the folder
            raise HFImportError(f"{folder / INDEX}: shard {name!r} is not a file of the folder")
        try:
            state.update(load_file(str(path)))
        except (OSError, SafetensorError) as err:
            raise HFImportError(f"{path}: not a readable safetensors file ({err})") from None
    return state


def _strip(state: dict, prefix: str) -> dict:
    """Names without the base model's prefix ('transformer.', 'model.') where the file has it."""
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def gpt2_weights(hf: dict, spec) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel's tensors under GPT2's names. HF's Conv1D stores (in, out): transposed to Linear's."""
    hf = _strip(hf, "transformer.")
    out = {"wte.weight": hf.pop("wte.weight"), "wpe.weight": hf.pop("wpe.weight")[:spec.ctx],
           "ln_f.weight": hf.pop("ln_f.weight"), "ln_f.bias": hf.pop("ln_f.bias")}
    out["lm_head.weight"] = out["wte.weight"]
    hf.pop("lm_head.weight", None)  # tied: the embedding
    for i in range(spec.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        for ours, theirs, conv in (("ln_1", "ln_1", False), ("ln_2", "ln_2", False), ("attn.qkv", "attn.c_attn", True),
                                   ("attn.proj", "attn.c_proj", True), ("mlp.fc", "mlp.c_fc", True),
                                   ("mlp.proj", "mlp.c_proj", True)):
            weight = hf.pop(f"{h}{theirs}.weight")
            out[f"{b}{ours}.weight"] = weight.t().contiguous() if conv else weight
            out[f"{b}{ours}.bias"] = hf.pop(f"{h}{theirs}.bias")
        for buffer in ("attn.bias", "attn.masked_bias"):  # causal-mask buffers of older checkpoints, not weights
            hf.pop(f"{h}{buffer}", None)
    return out, hf


def llama_weights(hf: dict, spec) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's / Qwen2ForCausalLM's tensors under Llama's names (both are nn.Linear: no transposes)."""
    hf = _strip(hf, "model.")
    out = {"wte.weight": hf.pop("embed_tokens.weight"), "norm.weight": hf.pop("norm.weight")}
    head = hf.pop("lm_head.weight", None)
    out["lm_head.weight"] = out["wte.weight"] if spec.tie_embeddings else head
    if head is None and not spec.tie_embeddings:
        raise HFImportError("the checkpoint has no lm_head.weight (tied embeddings) but the run has "
                            "arch.tie_embeddings=false")
    names = [("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"), ("attn.q", "self_attn.q_proj"),
             ("attn.k", "self_attn.k_proj"), ("attn.v", "self_attn.v_proj"), ("attn.o", "self_attn.o_proj"),
             ("mlp.gate", "mlp.gate_proj"), ("mlp.up", "mlp.up_proj"), ("mlp.down", "mlp.down_proj")]
    for i in range(spec.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        for ours, theirs in names:
            out[f"{b}{ours}.weight"] = hf.pop(f"{h}{theirs}.weight")
        if spec.qkv_bias:
            for ours, theirs in names[2:5]:
                out[f"{b}{ours}.bias"] = hf.pop(f"{h}{theirs}.bias")
        hf.pop(f"{h}self_attn.rotary_emb.inv_freq", None)  # a buffer of older checkpoints, recomputed
    return out, hf


def load_checkpoint(model, folder) -> list[str]:
    """Map the folder's weights onto `model` (built from a spec that check_spec accepts) in place. Returns the
    names of the model's tensors the checkpoint has none for (the attention core's own), which keep their
    initialisation."""
    spec = model.spec
    check_spec(spec, folder)
    hf = read_weights(folder)
    try:
        mapped, left = (gpt2_weights if spec.arch == "gpt2" else llama_weights)(dict(hf), spec)
    except KeyError as err:
        raise HFImportError(f"trainer.init_from={str(folder)!r}: the safetensors hold no {err.args[0]!r}, which "
                            f"a {spec.arch} checkpoint of config.json's shape has") from None
    if left:
        raise HFImportError(f"trainer.init_from={str(folder)!r}: {len(left)} tensors of the checkpoint have no place "
                            f"in the {spec.arch} model (first: {sorted(left)[0]!r})")
    state = model.state_dict()
    for name, value in mapped.items():
        if tuple(value.shape) != tuple(state[name].shape):
            raise HFImportError(f"trainer.init_from={str(folder)!r}: {name} has shape {tuple(value.shape)} in the "
                                f"checkpoint, {tuple(state[name].shape)} in the model")
    bad = first_non_finite(mapped)
    if bad is not None:
        raise HFImportError(f"trainer.init_from={str(folder)!r}: {bad} holds NaN or infinite values")
    kept = sorted(set(state) - set(mapped))
    state.update({name: value.to(state[name].dtype) for name, value in mapped.items()})
    model.load_state_dict(state)
    return kept


def main(argv=None) -> int:
    """python -m longctx.hf.import_weights <folder>: the overrides that build the folder's model."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m longctx.hf.import_weights <Hugging Face folder>\n"
             "prints the train.py overrides that build its model")
    if args in (["-h"], ["--help"]):
        print(usage)
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        print(usage, file=sys.stderr)
        return 2
    try:
        print(" ".join(overrides(args[0]) + [f"trainer.init_from={args[0]}"]))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
