"""Architectures (GPT-2, RWKV7) with a swappable attention core: `build_model(ModelSpec(...))`.

Adding an architecture = one module in this folder whose model class is decorated with
`@register_architecture("name")` (registry.py) + `conf/arch/<name>.yaml`. Every module here is imported below, so
the name is written once, in the decorator.
"""
import importlib
import pkgutil

from .attention import ATTENTIONS, build_attention
from .registry import ARCHITECTURES, NATIVE_MIXINGS, architecture_class, native_mixing, register_architecture
from .spec import ModelSpec, model_spec, model_vocab_size

for _module in pkgutil.iter_modules(__path__):
    if not _module.ispkg:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ARCHITECTURES", "ATTENTIONS", "NATIVE_MIXINGS", "ModelSpec", "architecture_class", "build_attention",
           "build_model", "model_spec", "model_vocab_size", "native_mixing", "register_architecture"]


def build_model(spec: ModelSpec):
    """ModelSpec -> nn.Module with forward(input_ids, targets=None, cache=None), generate(...),
    flops_per_token(ctx), state_size(ctx)."""
    return architecture_class(spec.arch)(spec)
