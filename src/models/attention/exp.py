"""exp: causal softmax attention, optionally with a learned sink.

The sink (`attention.sink=true`) is one learned logit per head added to every query's softmax denominator, a key
that every query sees and whose value is zero (as in gpt-oss): a head that finds nothing worth reading can put its
weight there instead of on some token, without depending on where the BOS token sits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context_parallel import ContextParallel, gather_prefix
from .registry import boolean, register
from .shared import KVCache, StaticKVCache, attend_last, document_attention, mean_keys_per_query

try:  # optional extra: pip install longctx[flash]
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


@register("exp")
class ExpAttention(nn.Module):
    """Causal softmax attention. GPU: flash-attn when installed, else SDPA preferring cuDNN, then flash.
    Decoding keeps a KV cache of every past position. Context parallel: the keys and values of this slice and the
    slices before it, all-gathered (models.context_parallel)."""

    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    @dataclass(frozen=True)
    class Params:
        sink: bool = False  # a learned per-head logit in every softmax denominator (module docstring)

        def __post_init__(self):
            boolean(self, "sink")

    def __init__(self, spec, params: Params):
        super().__init__()
        self.d_model, self.head_dim = spec.d_model, spec.head_dim
        self.scale = spec.head_dim ** -0.5  # given explicitly: the sink pads head dims, which would change the default
        self.sink_logit = nn.Parameter(torch.zeros(spec.n_heads)) if params.sink else None

    def forward(self, q, k, v, x=None, doc_ids=None):
        """doc_ids (b, t) int: packed documents, each attending only within itself (None: one sequence a row)."""
        if doc_ids is not None:
            return self._documents(q, k, v, doc_ids)
        if self.context_parallel is not None:
            return self._context_parallel(q, k, v)
        if self.sink_logit is not None:
            q, k, v = with_sink(q, k, v, self.sink_logit)
            return self._causal(q, k, v)[:, 1:, :, : self.head_dim]
        return self._causal(q, k, v)

    def _context_parallel(self, q, k, v):
        """This slice's queries over the keys of slices 0..rank: the causal mask aligned to the keys' end."""
        kv = gather_prefix(torch.cat([k, v], dim=-1), self.context_parallel)    # (b, start + t, h, 2d)
        keys, values = kv.split(k.shape[-1], dim=-1)
        if self.sink_logit is not None:  # the sink in front of the first slice's keys, as in one process
            q, keys, values = with_sink(q, keys, values, self.sink_logit)
            q = q[:, 1:]
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            y = flash_attn_func(q, keys, values, causal=True, softmax_scale=self.scale)  # causal: bottom-right
        else:  # the bottom-right causal bias: SDPA's fused kernels, no (t, T) mask built
            from torch.nn.attention.bias import causal_lower_right

            qt, kt, vt = (z.transpose(1, 2) for z in (q, keys, values))             # (b, h, ., d)
            mask = causal_lower_right(qt.shape[2], kt.shape[2])
            y = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=self.scale).transpose(1, 2)
        return y[..., : self.head_dim]

    def _documents(self, q, k, v, doc_ids):
        if self.sink_logit is None:
            return document_attention(q, k, v, doc_ids, self.scale)
        q, k, v = with_sink(q, k, v, self.sink_logit)
        return document_attention(q, k, v, doc_ids, self.scale, sink=True)[:, 1:, :, : self.head_dim]

    def _causal(self, q, k, v):
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            return flash_attn_func(q, k, v, causal=True, softmax_scale=self.scale)  # (b, t, h, d) natively
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        if q.is_cuda:
            with sdpa_fastest():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return y.transpose(1, 2)  # (b, t, h, d)

    def decode(self, q, k, v, x, cache: KVCache | StaticKVCache | None):
        if isinstance(cache, StaticKVCache):  # one token into preallocated buffers (decoding.StaticDecoder)
            cache.append(k, v)
            return cache.attend(q, self.scale, self.sink_logit), cache
        if cache is None:  # the prompt: the training form (flash / cuDNN), then its keys and values cached
            cache = KVCache()
            cache.append(k, v)
            return self.forward(q, k, v, x), cache
        keys, values = cache.append(k, v)
        if self.sink_logit is None:
            return attend_last(q, keys, values), cache
        q, keys, values = with_sink(q, keys, values, self.sink_logit)
        return attend_last(q[:, 1:], keys, values, scale=self.scale)[..., : self.head_dim], cache

    def static_state(self, cache: KVCache, pos, capacity: int) -> StaticKVCache:
        """The prompt's KV cache moved into buffers of `capacity` positions (pos: the layer's position tensor)."""
        return StaticKVCache(*cache.cached(), pos, capacity)

    def state_size(self, ctx):  # the KV cache: keys and values of every head at every position
        return 2 * ctx * self.d_model

    def state_flops(self, ctx):  # q.K and A.V, each d multiply-adds per key, per head
        return 2 * 2 * self.d_model * mean_keys_per_query(ctx, ctx)

    def forward_flops(self, ctx, device_type="cuda", dtype=torch.bfloat16):  # every engine runs the counted form
        return float(self.state_flops(ctx))


SINK_PAD = 8  # extra head dims that carry the sink: fused kernels want head dims in multiples of 8


def with_sink(q, k, v, logit):
    """q (b, n, h, d), k, v (b, t, h, d) and a (h,) logit -> the same attention with a sink in front, as plain causal
    attention: position 0 is the sink (its key scores `logit` against every query, its value is zero), head dims
    padded by SINK_PAD. Attend with scale d ** -0.5 (d the unpadded head dim), then drop position 0 and the padded
    dims."""
    d = q.shape[-1]
    q, k, v = (F.pad(z, (0, SINK_PAD, 0, 0, 1, 0)) for z in (q, k, v))  # zero position 0, zero head dims d..
    q[..., d] = 1.0
    # the sink's key is zero but for the queries' constant 1 dim: score logit * sqrt(d) * d ** -0.5 = logit
    k[:, 0, :, d] = logit * d ** 0.5
    return q, k, v


def sdpa_fastest():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch < 2.6 has no priority order: allow all, torch picks
        return sdpa_kernel(order)
