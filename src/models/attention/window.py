"""window: sliding-window softmax attention (each query sees itself and the window-1 keys before it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context_parallel import ContextParallel, halo
from .registry import positive_int, register
from .shared import KVCache, StaticKVCache, attend_last, doc_segments, document_attention, mean_keys_per_query

try:  # optional extra: pip install longctx[flash]
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None

_flex_compiled = None
_block_masks = {}


def _flex_window(q, k, v, window):
    """FlexAttention with a sliding-window block mask (compiled; GPU). q, k, v: (b, h, t, d)."""
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    t = q.shape[2]
    key = (t, window, q.device)
    if key not in _block_masks:
        def sliding_window(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
        _block_masks[key] = create_block_mask(sliding_window, None, None, t, t, device=q.device)
    return _flex_compiled(q, k, v, block_mask=_block_masks[key])


def blocked_window(q, k, v, window, doc_ids=None):
    """Exact sliding-window attention in plain PyTorch, O(t * window) memory: queries in blocks of `window`
    attend to their own block and the one before. q, k, v: (b, h, t, d). (FlexAttention has no CPU backward.)
    doc_ids (b, t): packed documents, a query sees keys of its own document only."""
    b, h, t, d = q.shape
    w = window
    n = -(-t // w)
    pad = n * w - t
    q, k, v = (F.pad(z, (0, 0, 0, pad)) for z in (q, k, v))
    qb = q.view(b, h, n, w, d)                                                 # (b, h, n, w, d)
    kb, vb = (F.pad(z, (0, 0, w, 0)).view(b, h, n + 1, w, d) for z in (k, v))  # block 0 of these is padding
    kb = torch.cat([kb[:, :, :-1], kb[:, :, 1:]], dim=3)                       # (b, h, n, 2w, d): prev | own
    vb = torch.cat([vb[:, :, :-1], vb[:, :, 1:]], dim=3)
    i = torch.arange(w, device=q.device)[:, None]          # query offset in its block
    j = torch.arange(2 * w, device=q.device)[None, :]      # key offset from the previous block's start
    allowed = (j > i) & (j <= i + w)                       # 0 <= (w + i) - j < w
    first = allowed & (j >= w)                             # block 0 has no previous block
    mask = torch.stack([first] + [allowed] * (n - 1))      # (n, w, 2w)
    if doc_ids is not None:  # padded positions get segments of their own (their outputs are cut off below)
        seg = F.pad(doc_segments(doc_ids), (0, pad), value=-1)                 # (b, n * w)
        seg_k = F.pad(seg, (w, 0), value=-2).view(b, n + 1, w)
        seg_k = torch.cat([seg_k[:, :-1], seg_k[:, 1:]], dim=2)                # (b, n, 2w): prev | own
        mask = (mask & (seg.view(b, n, w)[..., :, None] == seg_k[..., None, :]))[:, None]  # (b, 1, n, w, 2w)
    y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    return y.reshape(b, h, n * w, d)[:, :, :t]


@register("window")
class WindowAttention(nn.Module):
    """Sliding-window causal softmax attention. GPU: flash-attn's window when installed, else FlexAttention;
    CPU: an exact blocked form (FlexAttention has no CPU backward). Decoding keeps a rolling cache of the
    newest `window` keys and values. Context parallel: a halo of the window-1 keys and values before the slice."""

    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    @dataclass(frozen=True)
    class Params:
        window: int = 1024  # keys per query, itself included

        def __post_init__(self):
            positive_int(self, "window")

    def __init__(self, spec, params: Params):
        super().__init__()
        self.window, self.d_model = params.window, spec.d_model

    def forward(self, q, k, v, x=None, doc_ids=None):
        """doc_ids (b, t) int: packed documents, each attending only within itself (None: one sequence a row)."""
        if doc_ids is not None:
            if q.is_cuda or q.shape[1] <= self.window:
                return document_attention(q, k, v, doc_ids, window=self.window)
            return blocked_window(*(z.transpose(1, 2) for z in (q, k, v)), self.window, doc_ids).transpose(1, 2)
        if self.context_parallel is not None:
            return self._context_parallel(q, k, v)
        return self._windowed(q, k, v)

    def _windowed(self, q, k, v):
        """Queries and keys of the same positions."""
        t = q.shape[1]
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            return flash_attn_func(q, k, v, causal=True, window_size=(self.window - 1, 0))
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        if t <= self.window:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif q.is_cuda:
            y = _flex_window(q, k, v, self.window)
        else:
            y = blocked_window(q, k, v, self.window)
        return y.transpose(1, 2)  # (b, t, h, d)

    def _context_parallel(self, q, k, v):
        """The halo's keys and values in front of the slice's, with as many zero queries in front of its queries
        (outputs dropped): the same windowed forms as one process, no mask to build."""
        kv = halo(torch.cat([k, v], dim=-1), self.window - 1, self.context_parallel)  # (b, n <= window - 1, h, 2d)
        n = kv.shape[1]
        keys, values = (torch.cat([part, own], dim=1) for part, own in zip(kv.split(k.shape[-1], dim=-1), (k, v)))
        return self._windowed(F.pad(q, (0, 0, 0, 0, n, 0)), keys, values)[:, n:]

    def decode(self, q, k, v, x, cache: KVCache | StaticKVCache | None):
        if isinstance(cache, StaticKVCache):  # one token into the preallocated ring (decoding.StaticDecoder)
            cache.append(k, v)
            return cache.attend(q, q.shape[-1] ** -0.5), cache
        if cache is None:
            cache = KVCache(keep=self.window)
        if cache.length == 0 and q.shape[1] > self.window:  # a long prompt: the training form, then keep the tail
            cache.append(k[:, -self.window:], v[:, -self.window:])
            return self.forward(q, k, v, x), cache
        keys, values = cache.append(k, v)
        return attend_last(q, keys, values, self.window), cache

    def static_state(self, cache: KVCache, pos, capacity: int) -> StaticKVCache:
        """The prompt's newest `window` keys and values moved into a ring of `window` slots."""
        return StaticKVCache(*cache.cached(), pos, capacity, window=self.window)

    def state_size(self, ctx):
        return 2 * min(ctx, self.window) * self.d_model

    def state_flops(self, ctx):
        return 2 * 2 * self.d_model * mean_keys_per_query(ctx, self.window)

    def forward_flops(self, ctx, device_type="cuda", dtype=torch.bfloat16):  # every engine runs the counted form
        return float(self.state_flops(ctx))
