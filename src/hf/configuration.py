"""`LongctxConfig`: a longctx ModelSpec as a transformers config (model_type "longctx").

Every field of `longctx.models.ModelSpec` is a field of the config, under its own name (an architecture or option
added to ModelSpec later travels without a change here); transformers' usual names read them through
`attribute_map` (hidden_size = d_model, num_hidden_layers = n_layers, num_attention_heads = n_heads,
max_position_embeddings = ctx: the context the model was trained at). `spec()` is the ModelSpec, validated.
"""
from __future__ import annotations

import dataclasses
import importlib

EXTRA = "pip install 'longctx[hf]'"


def require(*packages: str, what: str = "longctx.hf") -> None:
    """ImportError of one line naming the first missing optional package and the extra that installs it."""
    for package in packages:
        try:
            importlib.import_module(package)
        except ImportError:
            raise ImportError(f"{what} needs the optional package {package!r}, which is not installed: "
                              f"{EXTRA}") from None


require("transformers", "safetensors")

from transformers import PretrainedConfig  # noqa: E402

from longctx.models import ModelSpec  # noqa: E402

SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec) if f.name != "checkpoint_activations")


class LongctxConfig(PretrainedConfig):
    """A longctx model's config: the ModelSpec's fields (see longctx.models.spec), plus transformers' own keys."""
    model_type = "longctx"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "max_position_embeddings": "ctx"}

    def __init__(self, **kwargs):
        defaults = ModelSpec.__dataclass_fields__
        for name in SPEC_FIELDS:
            field = defaults[name]
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            setattr(self, name, kwargs.pop(name, default))
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    @classmethod
    def from_spec(cls, spec: ModelSpec, **kwargs) -> "LongctxConfig":
        return cls(**{name: getattr(spec, name) for name in SPEC_FIELDS}, **kwargs)

    def spec(self) -> ModelSpec:
        """The ModelSpec these fields describe (ValueError naming a bad field)."""
        return ModelSpec.from_dict({name: getattr(self, name) for name in SPEC_FIELDS})
