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


def doc_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """Packed documents, `doc_ids` (b, t) int numbering them along each row -> (b, t) bool: True at the first token
    of each document (position 0 included)."""
    return F.pad(doc_ids[:, 1:] != doc_ids[:, :-1], (1, 0), value=True)


def doc_segments(doc_ids: torch.Tensor) -> torch.Tensor:
    """(b, t) int: 0, 1, ... numbering the runs of equal doc_ids along each row (a document is one run)."""
    return doc_starts(doc_ids).cumsum(1) - 1


def document_attention(q, k, v, doc_ids, scale: float | None = None, window: int | None = None,
                       sink: bool = False):
    """Causal softmax attention within packed documents: query i sees key j <= i of its own document (and with
    `window`, i - j < window). q, k, v (b, t, h, d) -> (b, t, h, d); doc_ids (b, t) int. sink: position 0 is
    exp's sink (`with_sink`), seen by every query (doc_ids then covers positions 1..). CUDA: FlexAttention with a
    document block mask; CPU: SDPA with a boolean mask, O(t^2) memory."""
    seg = doc_segments(doc_ids)
    if sink:  # the sink sits in front, in a document of its own that every query may read
        seg = F.pad(seg + 1, (1, 0))
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))                          # (b, h, t, d)
    if q.is_cuda:
        y = _flex_documents(q, k, v, seg, scale, window, sink)
    else:
        t = q.shape[2]
        i = torch.arange(t, device=q.device)[:, None]
        j = torch.arange(t, device=q.device)[None, :]
        allowed = (j <= i) if window is None else (j <= i) & (i - j < window)  # (t, t)
        same = seg[:, :, None] == seg[:, None, :]                              # (b, t, t)
        if sink:
            same = same | (j == 0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=(allowed & same)[:, None], scale=scale)
    return y.transpose(1, 2)


_flex_documents_compiled = None


def _flex_documents(q, k, v, seg, scale, window, sink):
    """FlexAttention (compiled) with the document mask of `seg` (b, t); q, k, v (b, h, t, d)."""
    global _flex_documents_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex_documents_compiled is None:
        _flex_documents_compiled = torch.compile(flex_attention, dynamic=False)

    def documents(b, h, q_idx, kv_idx):
        keep = (seg[b, q_idx] == seg[b, kv_idx]) & (q_idx >= kv_idx)
        if window is not None:
            keep = keep & (q_idx - kv_idx < window)
        return keep | (kv_idx == 0) if sink else keep

    t = q.shape[2]
    mask = create_block_mask(documents, seg.shape[0], None, t, t, device=q.device)
    return _flex_documents_compiled(q, k, v, block_mask=mask, scale=scale)


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

    def cached(self):
        """Every cached key and value, (b, length, h, d) views."""
        return self._k[:, :self.length], self._v[:, :self.length]

    def nbytes(self) -> int:
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()


# ----------------------------------------------------------------------------------------------------------
# static decoding buffers: preallocated once, updated in place, so one decoding step can be a CUDA graph

PV_BLOCK = 256  # keys per block of the attention-times-values product: blocks run side by side (flash decoding)


def _bmm_fp32(a, b):
    """a @ b (batched, same leading dims), bf16/fp16 inputs, fp32 result straight from the matmul's accumulator."""
    lead = a.shape[:-2]
    out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), out_dtype=torch.float32)
    return out.view(*lead, a.shape[-2], b.shape[-1])


_FP32_OUT: dict = {}


def fp32_out_matmul(device, dtype) -> bool:
    """Whether bf16/fp16 matmuls on `device` can write fp32 results (torch.bmm's out_dtype, CUDA), probed once."""
    key = (str(device), dtype)
    if key not in _FP32_OUT:
        _FP32_OUT[key] = False
        if torch.device(device).type == "cuda" and dtype in (torch.bfloat16, torch.float16):
            try:
                x = torch.ones(1, 1, 8, device=device, dtype=dtype)
                _FP32_OUT[key] = _bmm_fp32(x, x.transpose(-1, -2)).dtype == torch.float32
            except (TypeError, RuntimeError):  # a torch without out_dtype: fp32 copies instead
                pass
    return _FP32_OUT[key]


def _matmul_fp32(a, b, fp32_out: bool):
    """a @ b with an fp32 result: from the accumulator where the matmul can write fp32 (scores are not rounded to
    bf16), else from fp32 copies."""
    return _bmm_fp32(a, b) if fp32_out else a.float() @ b.float()


class StaticKVCache:
    """Keys and values of a fixed number of slots, (b, h, slots, d), allocated once and written in place.

    `pos` is the layer's position tensor (0-dim int64, the next token's position, advanced by the architecture):
    a new token goes to slot `pos` (the whole sequence, exp) or `pos % window` (a ring of the last `window`
    positions, window attention). `slot_pos` (slots,) holds each slot's position, -1 while empty, so attention
    reads every slot and masks the empty ones: the same kernels at every step. Exp rounds the slots up to a
    multiple of PV_BLOCK."""

    def __init__(self, k, v, pos: torch.Tensor, capacity: int, window: int | None = None):
        """k, v (b, n, h, d): the cached positions pos - n .. pos - 1 (their newest `window` with a window)."""
        b, n, h, d = k.shape
        self.window = window
        slots = window if window is not None else -(-capacity // PV_BLOCK) * PV_BLOCK
        self.k = k.new_zeros(b, h, slots, d)
        self.v = v.new_zeros(b, h, slots, d)
        self.slot_pos = torch.full((slots,), -1, dtype=torch.int64, device=k.device)
        self.pos = pos
        keep = n if window is None else min(n, window)
        positions = torch.arange(int(pos) - keep, int(pos), device=k.device)
        slot = positions if window is None else positions % window
        self.k[:, :, slot] = k[:, n - keep:].transpose(1, 2)
        self.v[:, :, slot] = v[:, n - keep:].transpose(1, 2)
        self.slot_pos[slot] = positions
        self.fp32_out = fp32_out_matmul(k.device, k.dtype)

    def append(self, k, v):
        """Write one token's (b, 1, h, d) key and value at its slot."""
        slot = (self.pos if self.window is None else self.pos % self.window).view(1)
        self.k.index_copy_(2, slot, k.transpose(1, 2))
        self.v.index_copy_(2, slot, v.transpose(1, 2))
        self.slot_pos.index_copy_(0, slot, self.pos.view(1))

    def attend(self, q, scale: float, sink_logit=None):
        """Softmax attention of q (b, 1, h, d) over the filled slots -> (b, 1, h, d) in q's dtype. Scores and softmax
        in fp32; sink_logit (h,): a learned logit in every denominator whose value is zero (exp's sink)."""
        b, _, h, d = q.shape
        slots = self.k.shape[2]
        with torch.autocast(q.device.type, enabled=False):
            qs = (q.float() * scale).to(self.k.dtype).transpose(1, 2)             # (b, h, 1, d)
            scores = _matmul_fp32(qs, self.k.transpose(-1, -2), self.fp32_out)    # (b, h, 1, slots) fp32
            scores = scores.masked_fill(self.slot_pos < 0, float("-inf"))
            if sink_logit is not None:
                sink = sink_logit.float().view(1, h, 1, 1).expand(b, h, 1, 1)
                probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :slots]
            else:
                probs = scores.softmax(-1)
            probs = probs.to(self.v.dtype)
            if slots % PV_BLOCK == 0 and slots > PV_BLOCK:                         # blocks of keys side by side
                n = slots // PV_BLOCK
                parts = _matmul_fp32(probs.reshape(b, h, n, 1, PV_BLOCK), self.v.view(b, h, n, PV_BLOCK, d),
                                     self.fp32_out)
                y = parts.sum(2)                                                   # (b, h, 1, d)
            else:
                y = _matmul_fp32(probs, self.v, self.fp32_out)
        return y.transpose(1, 2).to(q.dtype)

    def nbytes(self) -> int:
        return (self.k.numel() + self.v.numel()) * self.k.element_size()
