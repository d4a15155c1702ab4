"""ModelSpec: every number that decides a model's shape, checked once at construction.

Fields follow docs/architecture.md. `build_model(spec)` (see `__init__.py`) turns a spec into an `nn.Module`.
The attention's own parameters (p, window, ...) live in `attention_params`, declared and validated by the
attention core itself (models/attention/): a spec knows no attention by name. `model_spec(cfg, vocab)` is the spec
of a composed config (the trainer's, a run's config.yaml).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from .attention import attention_class, params_from_conf, parse_params
from .registry import ARCHITECTURES


def __getattr__(name: str):
    if name == "ARCHS":  # the registered architectures (models/registry.py), known once the models are imported
        return tuple(ARCHITECTURES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


POSITIONS = ("rotary", "learned")
ACTIVATIONS = ("gelu", "gelu_tanh")
# Fields only one architecture reads -> that architecture (elsewhere they must keep their defaults)
ARCH_OPTIONS = {"positions": "gpt2", "activation": "gpt2", "n_kv_heads": "llama", "d_ff": "llama",
                "norm_eps": "llama", "tie_embeddings": "llama", "qkv_bias": "llama"}

# Flat fields of specs saved before `attention_params` existed (old checkpoints), mapped by `from_dict`.
LEGACY_ATTENTION_FIELDS = ("p", "window", "chunk_size", "gating")


@dataclass
class ModelSpec:
    arch: str = "gpt2"                 # a registered architecture (models/registry.py, conf/arch/<name>.yaml)
    attention: str = "exp"             # a registered attention core (models/attention/, conf/attention/<name>.yaml)
    attention_params: dict = field(default_factory=dict)  # that core's parameters; missing ones take its defaults
    vocab_size: int = 50304
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    mlp_ratio: int = 4
    ctx: int = 1024                    # longest sequence the model will see in training
    rope_base: float = 10000.0
    rope_dims: int | None = None       # head dims rotated by the rotary embedding (the first ones); None = all
    token_shift: bool = False          # GPT-2: q/k/v read a learned mix of each position and its predecessor
    positions: str = "rotary"          # GPT-2: rotary, or learned (a table of ctx absolute positions, as GPT-2's own)
    activation: str = "gelu"           # GPT-2's MLP: gelu (exact) or gelu_tanh (GPT-2's own, HF's gelu_new)
    n_kv_heads: int | None = None      # Llama: key/value heads (grouped-query attention); None = n_heads
    d_ff: int | None = None            # Llama: SwiGLU width; None = 2/3 * mlp_ratio * d_model, rounded up to 64
    norm_eps: float = 1e-5             # Llama: the RMSNorms' epsilon
    tie_embeddings: bool = True        # Llama: the LM head is the input embedding (GPT-2's always is)
    qkv_bias: bool = False             # Llama: biases on q, k, v (Qwen2's layout)
    checkpoint_activations: bool = False

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"ModelSpec.{field}={getattr(self, field)!r}: {why}")

        if self.arch not in ARCHITECTURES:
            bad("arch", f"unknown architecture; known: {', '.join(sorted(ARCHITECTURES))}")
        # complete and validated: errors name the parameter (attention.window=0: must be a positive integer)
        self.attention_params = dataclasses.asdict(parse_params(self.attention, self.attention_params))
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "ctx"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(field, "must be a positive integer")
        if self.d_model % self.n_heads:
            bad("d_model", f"must be divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            bad("n_heads", f"head_dim = d_model/n_heads = {self.d_model // self.n_heads} must be even (rotary pairs)")
        if not isinstance(self.rope_base, (int, float)) or isinstance(self.rope_base, bool) or self.rope_base <= 1:
            bad("rope_base", "must be a number > 1")
        if self.rope_dims is not None and (isinstance(self.rope_dims, bool) or not isinstance(self.rope_dims, int)
                                           or self.rope_dims % 2 or not 2 <= self.rope_dims <= self.head_dim):
            bad("rope_dims", f"must be null (every head dim) or an even integer in [2, head_dim={self.head_dim}]")
        if not isinstance(self.token_shift, bool):
            bad("token_shift", "must be true or false")
        if self.token_shift and self.arch != "gpt2":
            bad("token_shift", f"is GPT-2's option; the {self.arch} block shifts tokens in its own way")
        if not isinstance(self.checkpoint_activations, bool):
            bad("checkpoint_activations", "must be true or false")
        self._check_arch_options(bad)

    def _check_arch_options(self, bad):
        """The options one architecture reads: each in range, and left at its default on the others."""
        if self.positions not in POSITIONS:
            bad("positions", f"expected one of {', '.join(POSITIONS)}")
        if self.activation not in ACTIVATIONS:
            bad("activation", f"expected one of {', '.join(ACTIVATIONS)}")
        if self.n_kv_heads is not None and (isinstance(self.n_kv_heads, bool) or not isinstance(self.n_kv_heads, int)
                                            or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            bad("n_kv_heads", f"must be null or a positive integer dividing n_heads={self.n_heads}")
        if self.d_ff is not None and (isinstance(self.d_ff, bool) or not isinstance(self.d_ff, int) or self.d_ff < 1):
            bad("d_ff", "must be null or a positive integer")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not 0 < self.norm_eps < 1:
            bad("norm_eps", "must be a number in (0, 1)")
        for name in ("tie_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        for name, arch in ARCH_OPTIONS.items():
            if getattr(self, name) != DEFAULTS[name] and self.arch != arch:
                bad(name, f"is the {arch} architecture's option (arch={self.arch} has none)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rotary_dims(self) -> int:
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ffn_dim(self) -> int:  # Llama's SwiGLU width: 3 matrices of 2/3 the width hold GPT-2's MLP's parameters
        return self.d_ff if self.d_ff is not None else 64 * -(-2 * self.mlp_ratio * self.d_model // (3 * 64))

    @classmethod
    def from_dict(cls, fields: dict) -> "ModelSpec":
        """A spec from a plain dict (a checkpoint's `spec`), in today's layout or the older flat one, whose
        attention parameters were fields of their own (p, window, chunk_size, gating): each of those is kept
        where the attention declares it and dropped where it does not (exp never read p)."""
        fields = dict(fields)
        legacy = {k: fields.pop(k) for k in LEGACY_ATTENTION_FIELDS if k in fields}
        if legacy and "attention_params" not in fields:
            declared = {f.name for f in dataclasses.fields(attention_class(fields.get("attention", "exp")).Params)}
            fields["attention_params"] = {k: v for k, v in legacy.items() if k in declared}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"ModelSpec.{unknown[0]}={fields[unknown[0]]!r}: not a field of ModelSpec "
                             f"(fields: {', '.join(sorted(known))})")
        return cls(**fields)


def model_vocab_size(data_vocab: int) -> int:
    """Large vocabularies are padded to a multiple of 64: the embedding and LM-head matmuls then run whole
    tensor-core tiles (nanoGPT's GPT-2 recipe: 50257 -> 50304). Small ones (the ICL tasks') stay as they are."""
    return data_vocab if data_vocab < 1024 else 64 * math.ceil(data_vocab / 64)


# Config keys newer than some saved runs: a config.yaml without one built the model with the field's default
OPTIONAL_KEYS = {"model.mlp_ratio": "mlp_ratio", "arch.rope_base": "rope_base", "arch.rope_dims": "rope_dims",
                 "arch.token_shift": "token_shift", "arch.positions": "positions", "arch.activation": "activation",
                 "arch.n_kv_heads": "n_kv_heads", "arch.d_ff": "d_ff", "arch.norm_eps": "norm_eps",
                 "arch.tie_embeddings": "tie_embeddings", "arch.qkv_bias": "qkv_bias"}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec) if f.default is not dataclasses.MISSING}


# Each ModelSpec field's config key, for messages in config terms
SPEC_KEYS = {"arch": "arch", "attention": "attention", "vocab_size": "vocab_size (from the data)",
             "d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
             "mlp_ratio": "model.mlp_ratio", "ctx": "ctx", "attention_params": "attention.*",
             "rope_base": "arch.rope_base", "rope_dims": "arch.rope_dims", "token_shift": "arch.token_shift",
             "positions": "arch.positions", "activation": "arch.activation", "n_kv_heads": "arch.n_kv_heads",
             "d_ff": "arch.d_ff", "norm_eps": "arch.norm_eps", "tie_embeddings": "arch.tie_embeddings",
             "qkv_bias": "arch.qkv_bias"}


def _config_value(cfg, key: str, default=dataclasses.MISSING):
    """cfg's value at the dotted `key`; `default` where it is missing or null, else a ValueError naming the key."""
    node = cfg
    for part in key.split("."):
        node = node.get(part) if hasattr(node, "get") else None
        if node is None:
            if default is dataclasses.MISSING:
                raise ValueError(f"config: {key} is missing (a config of another longctx version?)")
            return default
    return node


def model_spec(cfg, vocab_size: int) -> ModelSpec:
    """The model of a composed config (a DictConfig or nested dicts): conf/attention/<name>.yaml's keys (but name and
    tag) go to the attention core. Keys newer than a saved config take ModelSpec's defaults; a missing required
    key raises ValueError naming it."""
    optional = {name: _config_value(cfg, key, DEFAULTS[name]) for key, name in OPTIONAL_KEYS.items()}
    try:
        return _spec_of(cfg, vocab_size, optional)
    except ValueError as err:   # ModelSpec names its field; the user typed the config key
        named = re.match(r"ModelSpec\.(\w+)=", str(err))
        if named is None or named[1] not in SPEC_KEYS:
            raise
        raise ValueError(SPEC_KEYS[named[1]] + str(err)[len(f"ModelSpec.{named[1]}"):]) from None


def _spec_of(cfg, vocab_size: int, optional: dict) -> ModelSpec:
    return ModelSpec(
        arch=_config_value(cfg, "arch.name"), attention=_config_value(cfg, "attention.name"),
        attention_params=params_from_conf(_config_value(cfg, "attention")), vocab_size=vocab_size,
        d_model=_config_value(cfg, "model.d_model"), n_layers=_config_value(cfg, "model.n_layers"),
        n_heads=_config_value(cfg, "model.n_heads"), ctx=_config_value(cfg, "ctx"), **optional,
        # trainer.activation_checkpointing=auto is decided at the first step
        checkpoint_activations=_config_value(cfg, "trainer.activation_checkpointing", False) is True,
    )
