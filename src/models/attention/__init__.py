"""Attention cores: maps from per-head queries, keys, values to per-head outputs, one module each.

Every core has the same interface, so an architecture holds one without knowing which:

    core = build_attention(spec)     # ATTENTIONS[spec.attention](spec, its validated Params)
    y = core(q, k, v, x)             # q, k, v, y: (b, t, h, d); x: (b, t, d_model), the block's input (for gates)
    y, state = core.decode(q, k, v, x, state)   # the next n tokens after those `state` holds (None: no tokens yet)
    static = core.static_state(state, pos, capacity)  # that state as buffers that decode(q, k, v, x, static)
                                                      # updates in place, one token a call (decoding.StaticDecoder)
    core.state_size(ctx)             # floats of recurrent / KV state, one layer
    core.state_flops(ctx)            # forward FLOPs per token that involve the state, one layer (multiply-add = 2)
    core.forward_flops(ctx, device_type, dtype)  # the same, of the form this core runs there (training FLOPs, MFU)

Projections (q/k/v/out) and rotary embeddings belong to the architecture; a core owns only what the attention
itself needs (e.g. the per-head gate of power/linear attention). Conventions for the accounting are in
docs/models.md: state FLOPs are averaged over the positions of a `ctx`-long causal sequence (a query at
position i of softmax attention reads i+1 keys), recurrent forms count one read and one write of the state per
token. Decoding states: exp a KV cache, window a rolling cache of the window, power/linear the constant-size
recurrent state; their static forms (shared.StaticKVCache, power.StaticPowerState) read nothing back to the host,
so a decoding step can be captured as a CUDA graph.

Adding an attention = one module in this folder (a core class decorated with `@register("name")`, with a
`Params` dataclass that declares and validates its parameters: see registry.py) + `conf/attention/<name>.yaml`
whose keys besides `name` and `tag` are those parameters. Every module here is imported below, so the name is
written once, in the decorator.
"""
import importlib
import pkgutil

from .registry import (ATTENTIONS, CONF_ONLY_KEYS, AttentionParamError, attention_class, params_from_conf,
                       parse_params, register)
from .shared import HeadGate

_INFRASTRUCTURE = {"registry", "shared"}
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in _INFRASTRUCTURE:
        importlib.import_module(f"{__name__}.{_module.name}")


def build_attention(spec):
    """The core named by `spec.attention`, with the parameters of `spec.attention_params`."""
    return attention_class(spec.attention)(spec, parse_params(spec.attention, spec.attention_params))


__all__ = ["ATTENTIONS", "CONF_ONLY_KEYS", "AttentionParamError", "HeadGate", "attention_class", "build_attention",
           "params_from_conf", "parse_params", "register"]
