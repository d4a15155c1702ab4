"""Pieces several cores share: the per-head gate, softmax attention of new queries over cached keys, the KV cache,
and the mean number of keys a causal query reads (for the FLOP accounting)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class HeadGate(nn.Module):
    """Per-head forget gate: log_g = logsigmoid(W x + b), (b, t, d_model) -> (b, t, h) float32, <= 0.

    b starts at +6.9 so the gate starts at sigmoid(6.9) ~ 0.999 (log_g ~ -1e-3): almost no forgetting at
    initialisation, information decays over ~1000 tokens until training says otherwise.
    """

    def __init__(self, d_model: int, n_heads: int, bias_init: float = 6.9):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_heads, d_model) * 0.02)
        self.bias = nn.Parameter(torch.full((n_heads,), bias_init))

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):  # fp32: bf16 would round b = 6.9 by ~0.03
            return F.logsigmoid(F.linear(x.float(), self.weight.float(), self.bias.float()))  # (b, t, h)


def mean_keys_per_query(ctx: int, window: int) -> float:
    """Average number of keys a causal query reads over positions 0..ctx-1 with a window of `window` keys."""
    w = min(window, ctx)
    return (w * (w + 1) / 2 + (ctx - w) * w) / ctx


def attend_last(q, k, v, window: int | None = None, scale: float | None = None):
    """Softmax attention of the last n positions over all T cached ones: q (b, n, h, d), k, v (b, T, h, d), T >= n.
    Query i sits at position T - n + i and sees keys j <= T - n + i (and T - n + i - j < window). scale: None =
    d ** -0.5."""
    n, T = q.shape[1], k.shape[1]
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))                          # (b, h, ., d)
    mask = None
    if n > 1 or (window is not None and window < T):
        i = torch.arange(T - n, T, device=q.device)[:, None]
        j = torch.arange(T, device=q.device)[None, :]
        mask = j <= i if window is None else (j <= i) & (i - j < window)      # (n, T)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)  # (b, n, h, d)


class KVCache:
    """Keys and values of the past positions, (b, T, h, d), in buffers that grow by a quarter (at least 256
    positions) when full, so appending a token copies nothing, amortized. With `keep` (the sliding window's rolling
    cache) only the newest `keep` positions are carried into a new buffer, so memory stays below
    2 * keep + the longest append."""

    def __init__(self, keep: int | None = None):
        self.keep, self.length = keep, 0
        self._k = self._v = None

    def append(self, k, v):
        """Add (b, n, h, d) keys and values; returns every cached key and value, these last. The returned
        tensors are views that later appends never overwrite."""
        n = k.shape[1]
        if self._k is None or self.length + n > self._k.shape[1]:
            self._reallocate(k, n)
        self._k[:, self.length:self.length + n] = k
        self._v[:, self.length:self.length + n] = v
        self.length += n
        return self._k[:, :self.length], self._v[:, :self.length]

    def _reallocate(self, like, n):
        kept = self.length if self.keep is None else min(self.length, self.keep)
        need = kept + n
        capacity = need + max(need // 4, 256) if self.keep is None else max(2 * self.keep, self.keep + n)
        old = (self._k, self._v)
        self._k, self._v = (like.new_empty(like.shape[0], capacity, *like.shape[2:]) for _ in range(2))
        if kept:
            self._k[:, :kept] = old[0][:, self.length - kept:self.length]
            self._v[:, :kept] = old[1][:, self.length - kept:self.length]
        self.length = kept

    def nbytes(self) -> int:
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()
