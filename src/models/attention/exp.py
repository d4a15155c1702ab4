"""exp: causal softmax attention."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .registry import register
from .shared import KVCache, attend_last, mean_keys_per_query

try:  # optional extra: pip install longctx[flash]
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


@register("exp")
class ExpAttention(nn.Module):
    """Causal softmax attention. GPU: flash-attn when installed, else SDPA preferring cuDNN, then flash.
    Decoding keeps a KV cache of every past position."""

    @dataclass(frozen=True)
    class Params:  # softmax attention has no parameters of its own
        pass

    def __init__(self, spec, params: Params):
        super().__init__()
        self.d_model, self.head_dim = spec.d_model, spec.head_dim

    def forward(self, q, k, v, x=None):
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            return flash_attn_func(q, k, v, causal=True)  # (b, t, h, d) layout natively
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        if q.is_cuda:
            with sdpa_fastest():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2)  # (b, t, h, d)

    def decode(self, q, k, v, x, cache: KVCache | None):
        if cache is None:  # the prompt: the training form (flash / cuDNN), then its keys and values cached
            cache = KVCache()
            cache.append(k, v)
            return self.forward(q, k, v, x), cache
        keys, values = cache.append(k, v)
        return attend_last(q, keys, values), cache

    def state_size(self, ctx):  # the KV cache: keys and values of every head at every position
        return 2 * ctx * self.d_model

    def state_flops(self, ctx):  # q.K and A.V, each d multiply-adds per key, per head
        return 2 * 2 * self.d_model * mean_keys_per_query(ctx, ctx)


def sdpa_fastest():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch < 2.6 has no priority order: allow all, torch picks
        return sdpa_kernel(order)
