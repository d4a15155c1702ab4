"""The attention registry: name -> core that maps per-head queries, keys, values to per-head outputs.

Every core has the same interface, so an architecture holds one without knowing which:

    core = ATTENTIONS[spec.attention](spec)
    y = core(q, k, v, x)        # q, k, v, y: (b, t, h, d); x: (b, t, d_model), the block's input (for gates)
    core.state_size(ctx)        # floats of recurrent / KV state, one layer
    core.state_flops(ctx)       # forward FLOPs per token that involve the state, one layer (multiply-add = 2)

Projections (q/k/v/out) belong to the architecture; a core owns only what the attention itself needs
(e.g. the per-head gate of power/linear attention). Conventions for the accounting are in docs/models.md:
state FLOPs are averaged over the positions of a `ctx`-long causal sequence (a query at position i of
softmax attention reads i+1 keys), recurrent forms count one read and one write of the state per token.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from longctx.kernels import power_attention, state_dim  # CUDA -> Triton kernels, CPU -> PyTorch reference
from longctx.kernels.power.interface import CUDA_HEAD_DIMS

from .spec import ModelSpec

try:  # optional extra: pip install longctx[flash]
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


# -----------------------------------------------------------------------------------------------------------
# small parts

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


def _mean_keys_per_query(ctx: int, window: int) -> float:
    """Average number of keys a causal query reads over positions 0..ctx-1 with a window of `window` keys."""
    w = min(window, ctx)
    return (w * (w + 1) / 2 + (ctx - w) * w) / ctx


# -----------------------------------------------------------------------------------------------------------
# exp: causal softmax attention

class ExpAttention(nn.Module):
    """Causal softmax attention. GPU: flash-attn when installed, else SDPA preferring cuDNN, then flash."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.d_model, self.head_dim = spec.d_model, spec.head_dim

    def forward(self, q, k, v, x=None):
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            return flash_attn_func(q, k, v, causal=True)  # (b, t, h, d) layout natively
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        if q.is_cuda:
            with _sdpa_fastest():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2)  # (b, t, h, d)

    def state_size(self, ctx):  # the KV cache: keys and values of every head at every position
        return 2 * ctx * self.d_model

    def state_flops(self, ctx):  # q.K and A.V, each d multiply-adds per key, per head
        return 2 * 2 * self.d_model * _mean_keys_per_query(ctx, ctx)


def _sdpa_fastest():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
             SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # torch < 2.6 has no priority order: allow all, torch picks
        return sdpa_kernel(order)


# -----------------------------------------------------------------------------------------------------------
# window: sliding-window softmax attention (each query sees itself and the window-1 keys before it)

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


def _blocked_window(q, k, v, window):
    """Exact sliding-window attention in plain PyTorch, O(t * window) memory: queries in blocks of `window`
    attend to their own block and the one before. q, k, v: (b, h, t, d). (FlexAttention has no CPU backward.)"""
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
    y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    return y.reshape(b, h, n * w, d)[:, :, :t]


class WindowAttention(nn.Module):
    """Sliding-window causal softmax attention. GPU: flash-attn's window when installed, else FlexAttention;
    CPU: an exact blocked form (FlexAttention has no CPU backward)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.window, self.d_model = spec.window, spec.d_model

    def forward(self, q, k, v, x=None):
        t = q.shape[1]
        if q.is_cuda and flash_attn_func is not None and q.dtype in (torch.float16, torch.bfloat16):
            return flash_attn_func(q, k, v, causal=True, window_size=(self.window - 1, 0))
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # (b, h, t, d)
        if t <= self.window:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif q.is_cuda:
            y = _flex_window(q, k, v, self.window)
        else:
            y = _blocked_window(q, k, v, self.window)
        return y.transpose(1, 2)  # (b, t, h, d)

    def state_size(self, ctx):
        return 2 * min(ctx, self.window) * self.d_model

    def state_flops(self, ctx):
        return 2 * 2 * self.d_model * _mean_keys_per_query(ctx, self.window)


# -----------------------------------------------------------------------------------------------------------
# power: gated power attention, A_ij = (s q_i.k_j)^p exp(G_i - G_j)  (DESIGN.md; kernels in longctx.kernels)

class PowerAttention(nn.Module):
    """Gated power attention of degree p with per-head gating.

    Even p: normalized by the sum of attention weights (the paper's choice; (q.k)^p >= 0).
    Odd p (1, 3): (q.k)^p has no sign, so the sum can vanish; we use the unnormalized form (norm=False) and
    RMS-normalize each head's output instead (as FLA's GLA/RetNet do with their group norm).
    """

    def __init__(self, spec: ModelSpec, p: int | None = None):
        super().__init__()
        self.p = spec.p if p is None else p
        self.n_heads, self.head_dim = spec.n_heads, spec.head_dim
        self.chunk_size = spec.chunk_size
        self.norm = self.p % 2 == 0
        self.gate = HeadGate(spec.d_model, spec.n_heads) if spec.gating else None
        self.out_norm = None if self.norm else nn.RMSNorm(spec.head_dim, eps=1e-6)

    def forward(self, q, k, v, x):
        if q.is_cuda and self.head_dim not in CUDA_HEAD_DIMS:
            raise ValueError(f"{type(self).__name__} (p={self.p}) on CUDA needs head_dim = d_model / n_heads in "
                             f"{CUDA_HEAD_DIMS}, got {self.head_dim}")
        log_g = self.gate(x) if self.gate is not None else None  # (b, t, h) fp32 <= 0
        y = self.core(q, k, v, log_g)                              # (b, t, h, d)
        return y if self.out_norm is None else self.out_norm(y)

    def core(self, q, k, v, log_g):
        return power_attention(q, k, v, log_g, p=self.p, chunk_size=self.chunk_size, norm=self.norm)

    @property
    def expanded_dim(self) -> int:  # D = C(d + p - 1, p), the symmetric power's dimension
        return state_dim(self.p, self.head_dim)

    def state_size(self, ctx):  # per head: the D x d state, plus the D normalizer when normalized
        return self.n_heads * self.expanded_dim * (self.head_dim + int(self.norm))

    def state_flops(self, ctx):  # per token: read the state (query) and write it (key-value update)
        return 2 * 2 * self.state_size(ctx)


# -----------------------------------------------------------------------------------------------------------
# linear: gated linear attention, y_i = sum_j (s q_i.k_j) exp(G_i - G_j) v_j, RMS-normalized per head

class LinearAttention(PowerAttention):
    """Gated, normalized linear attention: power attention with p=1 (scalar per-head gate), output RMS-normed
    per head. GPU: FLA's `chunk_simple_gla` where its backward runs, else the p=1 power kernel (same math)."""

    def __init__(self, spec: ModelSpec):
        super().__init__(spec, p=1)

    def core(self, q, k, v, log_g):
        if q.is_cuda and _fla_simple_gla_ok(q.device):
            from fla.ops.simple_gla import chunk_simple_gla
            y, _ = chunk_simple_gla(q, k, v, g=log_g, scale=self.head_dim ** -0.5)
            return y
        return power_attention(q, k, v, log_g, p=1, chunk_size=self.chunk_size, norm=False)


def _fla_simple_gla_ok(device) -> bool:
    """FLA's gated chunk backward refuses Hopper with Triton < 3.7.1 (FLA issue #640)."""
    try:
        import fla.ops.simple_gla  # noqa: F401
        import triton
    except ImportError:
        return False
    hopper = torch.cuda.get_device_capability(device)[0] == 9
    version = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:3])
    return not (hopper and version < (3, 7, 1))


ATTENTIONS = {
    "exp": ExpAttention,
    "power": PowerAttention,
    "linear": LinearAttention,
    "window": WindowAttention,
}
