"""RWKV-7 "Goose" (Peng et al. 2025) as written in FLA, with a swappable attention core.

Follows `fla.layers.rwkv7.RWKV7Attention` and `fla.models.rwkv7.RWKV7ForCausalLM` (fla 0.6.0): parameter names
and shapes are FLA's, so a state dict maps one-to-one (prefix `model.` on FLA's side, see tests/models).

    block:   x = x + TimeMix(LN(x));  x = x + ChannelMix(LN(x))       (layer 0 first applies an extra LN)
    TimeMix: token shift -> r, k, v, gate g (+ decay w, in-context rate a for the native rule)
             -> core -> per-head GroupNorm -> * g -> o_proj
    ChannelMix: token shift -> key -> relu^2 -> value

The core is the only thing `attention=` changes:
  linear  the native RWKV-7 rule (a generalized delta rule with diagonal decay), per head, state S (d x d),
          registered as the native mixing "rwkv7" that serves attention=linear on this architecture:
              S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,   o_t = S_t^T r_t
          with a = -kk, b = kk * a_rate (kk = normalized k * k_k); plus RWKV's current-token bonus (r.k.r_k) v.
          GPU: FLA `chunk_rwkv7`; CPU: a chunked PyTorch form (fp32), checked against the plain recurrence.
  exp / window / power   the named attention (`build_attention(spec)`) over the block's own r (as
          queries), k, v, with rotary embeddings on r and k (as FLA's hybrid attention layers); the
          delta-rule-only parts (w, a, k_k, k_a, r_k) are not built.
On GPU the elementwise pieces use FLA's fused Triton ops (token shift, addcmul, k update, output
correction); on CPU their PyTorch references. Same function either way.
Decoding (`cache`, see decoding.py): each layer keeps the last token's inputs of its two token shifts and its
core's state (the native rule's S per head, or the attention's own decoding state).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .attention import build_attention
from .common import LanguageModelMixin, cached_token_shift, doc_starts, loss_head, model_positions, rotary
from .registry import native_mixing, register_architecture, register_native_mixing
from .spec import ModelSpec

LOG_DECAY_MIN = -0.6065306597126334        # -exp(-0.5): FLA's bound on the log decay w
# Low-rank sizes: fla.models.rwkv7.RWKV7Config defaults.
DECAY_RANK, GATE_RANK, A_RANK, V_RANK = 64, 128, 64, 16


# ----------------------------------------------------------------------------------------------------------
# elementwise pieces (FLA Triton ops on CUDA, PyTorch on CPU)

def mix(x, delta, *mus):
    """x + delta * mu for each mu: the six token-shift interpolations of the time mixing."""
    if x.is_cuda and len(mus) == 6 and x.shape[1] > 1:
        from fla.ops.rwkv7.fused_addcmul import fused_addcmul_rwkv7
        return fused_addcmul_rwkv7(x, delta, *mus)
    return tuple(torch.addcmul(x, delta, mu) for mu in mus)


def rwkv7_recurrent(r, w, k, v, a, b):
    """The RWKV-7 rule, token by token, fp32. All (b, t, h, d); w = log decay. Returns (b, t, h, d) in r's dtype.
    (FLA's `fla.ops.generalized_delta_rule.dplr.naive.dplr_recurrence` with scale 1.)"""
    dtype = r.dtype
    r, w, k, v, a, b = (z.float() for z in (r, w, k, v, a, b))
    S = r.new_zeros(r.shape[0], r.shape[2], r.shape[3], v.shape[3])            # (b, h, dk, dv)
    out = []
    with torch.autocast(r.device.type, enabled=False):                         # keep the state in fp32
        for i in range(r.shape[1]):
            aS = (a[:, i, :, :, None] * S).sum(-2, keepdim=True)                # a^T S_{t-1}: (b, h, 1, dv)
            S = S * w[:, i, :, :, None].exp() + b[:, i, :, :, None] * aS \
                + k[:, i, :, :, None] * v[:, i, :, None, :]
            out.append((r[:, i, :, :, None] * S).sum(-2))                       # S_t^T r_t: (b, h, dv)
    return torch.stack(out, dim=1).to(dtype)


def rwkv7_chunked(r, w, k, v, a, b, chunk: int = 32, initial_state=None, return_state: bool = False):
    """The same rule in chunks of `chunk` tokens (WY form, as FLA's `dplr_chunkwise`), fp32: states only at chunk
    boundaries, matmuls inside. initial_state (b, h, d, dv): S before the first token (default 0); return_state:
    also return S after the last token (fp32). Within a chunk, with G the inclusive cumulative log decay and u_t = a_t^T S_{t-1}:
        u = (I - A_ab)^-1 (A_ak V + (a * e^{G - w}) S_0),   A_xy[t, s] = sum_i x_t e^{G_t - w_t} / e^{G_s} y_s (s < t)
        o = (r * e^G) S_0 + A_qb u + A_qk V                 (A_q.: s <= t, r_t e^{G_t} / e^{G_s})
        S_c = e^{G_c} S_0 + (b e^{G_c - G})^T u + (k e^{G_c - G})^T V
    Factors e^{-G} stay finite while a chunk's summed log decay is > -88 (RWKV-7's w >= -0.61: >= -19.4)."""
    dtype = r.dtype
    B, T, H, D = r.shape
    C, N = chunk, -(-T // chunk)
    pad = N * C - T   # padded tokens: w = 0 (no decay) and zero r, k, v, a, b: they change nothing before them

    def blocks(z):  # (B, T, H, d) -> (B, H, N, C, d) fp32
        return F.pad(z.float(), (0, 0, 0, 0, 0, pad)).transpose(1, 2).reshape(B, H, N, C, z.shape[-1])

    with torch.autocast(r.device.type, enabled=False):
        r, w, k, v, a, b = map(blocks, (r, w, k, v, a, b))
        G = w.cumsum(-2)                                                        # (B, H, N, C, D)
        r_g, a_g = r * G.exp(), a * (G - w).exp()                               # decay up to t, up to t-1
        k_d, b_d = k * (-G).exp(), b * (-G).exp()
        strict = torch.ones(C, C, dtype=torch.bool, device=r.device).tril(-1)
        incl = torch.ones(C, C, dtype=torch.bool, device=r.device).tril()
        A_ab = (a_g @ b_d.transpose(-1, -2)) * strict                           # (B, H, N, C, C)
        A_ak = (a_g @ k_d.transpose(-1, -2)) * strict
        A_qb = (r_g @ b_d.transpose(-1, -2)) * incl
        A_qk = (r_g @ k_d.transpose(-1, -2)) * incl
        eye = torch.eye(C, device=r.device).expand_as(A_ab)
        L_inv = torch.linalg.solve_triangular(eye - A_ab, eye, upper=False, unitriangular=True)
        u_v, u_s = L_inv @ (A_ak @ v), L_inv @ a_g                              # u = u_v + u_s @ S_0
        o_v = A_qk @ v                                                          # (B, H, N, C, DV)
        G_end = G[:, :, :, -1:]                                                 # (B, H, N, 1, D)
        k_e, b_e = k * (G_end - G).exp(), b * (G_end - G).exp()
        S = r.new_zeros(B, H, D, v.shape[-1]) if initial_state is None else initial_state.float().clone()
        out = []
        for n in range(N):
            u = u_v[:, :, n] + u_s[:, :, n] @ S                                 # (B, H, C, DV)
            out.append(r_g[:, :, n] @ S + A_qb[:, :, n] @ u + o_v[:, :, n])
            S = G_end[:, :, n].exp().transpose(-1, -2) * S \
                + b_e[:, :, n].transpose(-1, -2) @ u + k_e[:, :, n].transpose(-1, -2) @ v[:, :, n]
        o = torch.stack(out, dim=2).reshape(B, H, N * C, -1)[:, :, :T]
    o = o.transpose(1, 2).to(dtype)                                             # (B, T, H, DV)
    return (o, S) if return_state else o   # padded tokens (no decay, zero k and b) leave S as the last real one


class LoRA(nn.Module):
    """x -> W2 act(W1 x) + bias (FLA's `fla.layers.rwkv6.LoRA`, same parameter names)."""

    def __init__(self, d_in, d_out, rank, activation=None, bias=True):
        super().__init__()
        act = {None: nn.Identity(), "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid()}[activation]
        self.lora = nn.Sequential(nn.Linear(d_in, rank, bias=False), act, nn.Linear(rank, d_out, bias=bias))
        nn.init.zeros_(self.lora[0].weight)
        gain = math.sqrt(d_out / rank) if d_out > rank else 1.0
        nn.init.orthogonal_(self.lora[2].weight, gain=0.1 * gain)
        if bias:
            nn.init.zeros_(self.lora[2].bias)

    def forward(self, x):
        return self.lora(x)


# ----------------------------------------------------------------------------------------------------------
# the native core: the RWKV-7 rule

@register_native_mixing("rwkv7", arch="rwkv7", serves=("linear",))
class RWKV7Rule(nn.Module):
    """State accounting and kernel dispatch of the native time mixing (no parameters of its own)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.head_dim = spec.n_heads, spec.head_dim

    def forward(self, r, w, k, v, a, b, doc_ids=None):  # all (b, t, h, d); doc_ids (b, t): packed documents
        if doc_ids is not None:
            return self._documents(r, w, k, v, a, b, doc_ids)
        if r.is_cuda:
            from fla.ops.rwkv7 import chunk_rwkv7
            o, _ = chunk_rwkv7(r=r, w=w, k=k, v=v, a=a, b=b, scale=1.0, safe_gate=True,
                               lower_bound=LOG_DECAY_MIN, chunk_size=64)
            return o
        return rwkv7_chunked(r, w, k, v, a, b)

    def _documents(self, r, w, k, v, a, b, doc_ids):
        """The rule restarted from S = 0 at each document's first token. CUDA: FLA's variable-length form (the
        rows laid end to end, `cu_seqlens` at every document start); CPU: each document on its own."""
        B, T = doc_ids.shape
        starts = doc_starts(doc_ids)
        if r.is_cuda:
            from fla.ops.rwkv7 import chunk_rwkv7
            cu_seqlens = F.pad(starts.flatten().nonzero().flatten(), (0, 1), value=B * T)
            flat = (z.reshape(1, B * T, *z.shape[2:]) for z in (r, w, k, v, a, b))
            o, _ = chunk_rwkv7(*flat, scale=1.0, cu_seqlens=cu_seqlens, safe_gate=True, lower_bound=LOG_DECAY_MIN,
                               chunk_size=64)
            return o.view(B, T, *o.shape[2:])
        out = []
        for row, row_starts in enumerate(starts.tolist()):
            bounds = [i for i, s in enumerate(row_starts) if s] + [T]
            out.append(torch.cat([rwkv7_chunked(*(z[row:row + 1, lo:hi] for z in (r, w, k, v, a, b)))
                                  for lo, hi in zip(bounds[:-1], bounds[1:])], dim=1))
        return torch.cat(out)

    def decode(self, r, w, k, v, a, b, state):
        """The next tokens after the state S (b, h, d, d) fp32 (None: zeros) -> (o, new S)."""
        if isinstance(state, StaticRWKV7State):  # one token, in place (decoding.StaticDecoder)
            return state.step(r, w, k, v, a, b), state
        if r.is_cuda:
            from fla.ops.rwkv7 import chunk_rwkv7
            return chunk_rwkv7(r=r, w=w, k=k, v=v, a=a, b=b, scale=1.0, initial_state=state, output_final_state=True,
                               safe_gate=True, lower_bound=LOG_DECAY_MIN, chunk_size=64)
        return rwkv7_chunked(r, w, k, v, a, b, initial_state=state, return_state=True)

    def static_state(self, state, pos, capacity: int) -> StaticRWKV7State:
        return StaticRWKV7State(state)

    def state_size(self, ctx):  # S: d x d per head
        return self.n_heads * self.head_dim ** 2

    def state_flops(self, ctx):  # a^T S, b (a^T S), k v^T, r^T S: 4 multiply-adds per entry; the decay: 1 multiply
        return self.n_heads * (2 * 4 + 1) * self.head_dim ** 2

    def forward_flops(self, ctx, device_type="cuda", dtype=torch.bfloat16):  # charged as the recurrence it computes
        return float(self.state_flops(ctx))


class StaticRWKV7State:
    """The rule's state S (b, h, d, dv) fp32, advanced one token at a time in place with plain torch ops (the same
    on CPU and in a CUDA graph): S <- diag(exp(w)) S + b (a^T S) + k v^T, o = S^T r (as rwkv7_recurrent)."""

    def __init__(self, state):
        self.S = (state if state.dtype == torch.float64 else state.float()).contiguous()

    def step(self, r, w, k, v, a, b):
        """All (b, 1, h, d) -> o (b, 1, h, dv) in r's dtype."""
        dtype = r.dtype
        with torch.autocast(r.device.type, enabled=False):
            r, w, k, v, a, b = (z[:, 0].to(self.S.dtype) for z in (r, w, k, v, a, b))  # (b, h, d)
            aS = a[..., None, :] @ self.S                                            # a^T S: (b, h, 1, dv)
            self.S.mul_(w.exp()[..., None]).add_(b[..., :, None] * aS)
            self.S.addcmul_(k[..., :, None], v[..., None, :])
            o = r[..., None, :] @ self.S                                             # (b, h, 1, dv)
        return o.transpose(1, 2).to(dtype)

    def nbytes(self) -> int:
        return self.S.numel() * self.S.element_size()


# ----------------------------------------------------------------------------------------------------------
# time mixing

class TimeMix(nn.Module):

    def __init__(self, spec: ModelSpec, layer_idx: int):
        super().__init__()
        d, L = spec.d_model, spec.n_layers
        self.layer_idx = layer_idx
        self.first = layer_idx == 0  # a bool for the forward: torch.compile specializes on ints (one graph a layer)
        self.n_heads, self.head_dim = spec.n_heads, spec.head_dim
        native = native_mixing(spec.arch, spec.attention)
        self.native = native is not None

        self.x_r = nn.Parameter(torch.zeros(1, 1, d))   # token-shift interpolation weights
        self.x_k = nn.Parameter(torch.zeros(1, 1, d))
        self.x_v = nn.Parameter(torch.zeros(1, 1, d))
        self.x_g = nn.Parameter(torch.zeros(1, 1, d))
        self.r_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        if layer_idx != 0:                               # value residual: mix in layer 0's v
            self.v_lora = LoRA(d, d, V_RANK)
        self.g_lora = LoRA(d, d, GATE_RANK, activation="sigmoid", bias=False)
        self.g_norm = nn.GroupNorm(spec.n_heads, d, eps=spec.head_dim * 1e-5)
        if self.native:
            self.x_w = nn.Parameter(torch.zeros(1, 1, d))
            self.x_a = nn.Parameter(torch.zeros(1, 1, d))
            self.k_k = nn.Parameter(torch.zeros(d))
            self.k_a = nn.Parameter(torch.zeros(d))
            self.r_k = nn.Parameter(torch.zeros(spec.n_heads, spec.head_dim))
            self.w_lora = LoRA(d, d, DECAY_RANK, activation="tanh")
            self.a_lora = LoRA(d, d, A_RANK)
            self.core = native.cls(spec)
        else:
            self.core = build_attention(spec)
        self._init_rwkv(d, L)

    @torch.no_grad()
    def _init_rwkv(self, d, L):
        """fla.layers.rwkv7.RWKV7Attention._initialize_weights (after RWKV-LM's RWKV-7 init)."""
        ratio_0_to_1 = self.layer_idx / max(L - 1, 1)
        ratio_1_to_almost0 = 1.0 - self.layer_idx / L
        n = torch.arange(d, dtype=torch.float32)
        ddd = (n / d).view(1, 1, d)
        linear = n / (d - 1) - 0.5
        zigzag = ((n % self.head_dim) - (self.head_dim - 1) / 2) / ((self.head_dim - 1) / 2)
        zigzag = zigzag * zigzag.abs()
        self.x_r.copy_(1.0 - ddd ** (0.2 * ratio_1_to_almost0))
        self.x_k.copy_(1.0 - ddd ** (0.7 * ratio_1_to_almost0))
        self.x_v.copy_(1.0 - ddd ** (0.7 * ratio_1_to_almost0))
        self.x_g.copy_(1.0 - ddd ** (0.2 * ratio_1_to_almost0))
        if self.layer_idx != 0:
            self.v_lora.lora[2].bias.copy_(0.73 - linear * 0.4)
        self.g_norm.weight.fill_(((self.layer_idx + 1) / L) ** 0.7)
        nn.init.orthogonal_(self.r_proj.weight)
        nn.init.orthogonal_(self.v_proj.weight)
        # FLA's model init re-draws o_proj (kaiming-uniform / sqrt(2 L)) after the layer zeroed it.
        nn.init.kaiming_uniform_(self.o_proj.weight, a=math.sqrt(5))
        self.o_proj.weight /= math.sqrt(2 * L)
        if self.native:
            www = -6 + 6 * (n / (d - 1)) ** (1 + ratio_0_to_1 ** 0.3)
            self.x_w.copy_(1.0 - ddd ** (0.9 * ratio_1_to_almost0))
            self.x_a.copy_(1.0 - ddd ** (0.9 * ratio_1_to_almost0))
            self.k_a.fill_(1.02)
            self.r_k.fill_(-0.04)
            self.k_k.copy_(0.71 - linear * 0.1)
            self.w_lora.lora[2].bias.copy_(www + 0.5 + zigzag * 2.5)
            self.a_lora.lora[2].bias.copy_(-0.19 + zigzag * 0.3 + linear * 0.4)
            nn.init.orthogonal_(self.k_proj.weight, gain=0.1)  # small keys for the delta rule
        else:
            nn.init.orthogonal_(self.k_proj.weight)             # attention cores: keys like queries

    def forward(self, x, v_first, rope, cache=None, doc_ids=None):
        """x (b, t, d) normalized block input; v_first (b, t, d) layer 0's values -> (out (b, t, d), v_first).
        rope: the model's rotary tables of x's positions (attention cores only; None for the native rule).
        cache: this layer's LayerCache when decoding (x continues its tokens), updated in place.
        doc_ids (b, t) int: packed documents (RWKV7.forward)."""
        b, t, d = x.shape
        h, hd = self.n_heads, self.head_dim
        heads = lambda z: z.view(b, t, h, hd)  # noqa: E731
        delta = cached_token_shift(x, cache, "attn", doc_ids)                     # (b, t, d)
        if self.native:
            xr, xw, xk, xv, xa, xg = mix(x, delta, self.x_r, self.x_w, self.x_k, self.x_v, self.x_a, self.x_g)
        else:
            xr, xk, xv, xg = mix(x, delta, self.x_r, self.x_k, self.x_v, self.x_g)
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)              # (b, t, d)
        if self.first:
            v_first = v
        else:
            v = torch.lerp(v, v_first, self.v_lora(xv).sigmoid())
        g = self.g_lora(xg)                                                        # (b, t, d) in (0, 1)

        if self.native:
            w = LOG_DECAY_MIN * self.w_lora(xw).sigmoid()                         # log decay in (-0.61, 0)
            a = self.a_lora(xa).sigmoid()                                          # in-context learning rate
            kk = F.normalize(heads(k * self.k_k), dim=-1)                          # (b, t, h, hd)
            k = self._k_update(k, a)
            r, w, k, a, v = map(heads, (r, w, k, a, v))
            r, w, k, v, kk, kka = (z.to(r.dtype) for z in (r, w, k, v, kk, kk * a))  # one dtype under autocast
            if cache is None:
                o = self.core(r, w, k, v, -kk, kka, doc_ids=doc_ids)               # (b, t, h, hd)
            else:
                o, cache.state = self.core.decode(r, w, k, v, -kk, kka, cache.state)
            o = self.g_norm(o.reshape(b * t, d)).view(b, t, d).to(r.dtype)
            o = self._bonus_and_gate(o, r, k, v, g)
        else:
            q, k = rotary(heads(r), rope), rotary(heads(k), rope)
            if cache is None:
                packed = {} if doc_ids is None else {"doc_ids": doc_ids}  # a core may take only (q, k, v, x)
                o = self.core(q, k, heads(v).to(q.dtype), x, **packed)            # (b, t, h, hd)
            else:
                o, cache.state = self.core.decode(q, k, heads(v).to(q.dtype), x, cache.state)
            o = self.g_norm(o.reshape(b * t, d)).view(b, t, d).to(q.dtype) * g
        if cache is not None and not cache.static:  # a static cache's shared position: the decoder advances it
            cache.pos += t
        return self.o_proj(o), v_first

    def _k_update(self, k, a):  # k * (1 + (a - 1) * k_a)
        if k.is_cuda:
            from fla.ops.rwkv7.fused_k_update import fused_k_rwkv7
            return fused_k_rwkv7(k, a, self.k_a)
        return k.addcmul(k * (a - 1), self.k_a)

    def _bonus_and_gate(self, o, r, k, v, g):  # (o + (r . k * r_k) v) * g, the current token's bonus
        if o.is_cuda:
            from fla.ops.rwkv7.gate_output_correction import gate_output_correction
            return gate_output_correction(o, r, k, self.r_k, v, g)
        bonus = (r * k * self.r_k).sum(-1, keepdim=True) * v                        # (b, t, h, hd)
        return (o + bonus.view(o.shape)) * g


# ----------------------------------------------------------------------------------------------------------
# channel mixing, block, model

class ChannelMix(nn.Module):

    def __init__(self, spec: ModelSpec, layer_idx: int):
        super().__init__()
        d, hidden = spec.d_model, 32 * -(-spec.mlp_ratio * spec.d_model // 32)
        self.x_k = nn.Parameter(1.0 - (torch.arange(d) / d) ** ((1.0 - layer_idx / spec.n_layers) ** 4))
        self.key = nn.Linear(d, hidden, bias=False)
        self.value = nn.Linear(hidden, d, bias=False)
        nn.init.orthogonal_(self.key.weight)
        nn.init.zeros_(self.value.weight)

    def forward(self, x, cache=None, doc_ids=None):
        k = self.key(x.addcmul(cached_token_shift(x, cache, "ffn", doc_ids), self.x_k))
        return self.value(F.relu(k) ** 2)


class Block(nn.Module):

    def __init__(self, spec: ModelSpec, layer_idx: int):
        super().__init__()
        d = spec.d_model
        if layer_idx == 0:
            self.pre_norm = nn.LayerNorm(d, eps=1e-5)
        self.attn_norm = nn.LayerNorm(d, eps=1e-5)
        self.attn = TimeMix(spec, layer_idx)
        self.ffn_norm = nn.LayerNorm(d, eps=1e-5)
        self.ffn = ChannelMix(spec, layer_idx)

    def forward(self, x, v_first, rope=None, cache=None, doc_ids=None):
        if hasattr(self, "pre_norm"):
            x = self.pre_norm(x)
        o, v_first = self.attn(self.attn_norm(x), v_first, rope, cache, doc_ids)
        x = x + o
        x = x + self.ffn(self.ffn_norm(x), cache, doc_ids)
        return x, v_first


@register_architecture("rwkv7")
class RWKV7(LanguageModelMixin, nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.native = native_mixing(spec.arch, spec.attention) is not None  # the RWKV-7 rule, not an attention core
        self.embeddings = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList([Block(spec, i) for i in range(spec.n_layers)])
        self.norm = nn.LayerNorm(spec.d_model, eps=1e-5)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)  # untied, as FLA's default
        nn.init.uniform_(self.embeddings.weight, -1e-4, 1e-4)
        gain = 0.5 * math.sqrt(spec.vocab_size / spec.d_model) if spec.vocab_size > spec.d_model else 0.5
        nn.init.orthogonal_(self.lm_head.weight, gain=gain)

    @property
    def residual_blocks(self) -> nn.ModuleList:  # what trainer.compile=blocks and checkpointing act on
        return self.layers

    def forward(self, input_ids, targets=None, cache=None, last_only=False, reduction="none", doc_ids=None):
        """input_ids (b, t) int64 -> logits (b, t, vocab); with targets (b, t): per-token NLL (b, t) fp32, or with
        reduction="sum" its sum (the trainer's loss: a backward without recomputation, common.nll_sum).
        cache: per-layer decoding caches (`new_cache()`), updated in place; input_ids continue their tokens.
        last_only: True or n: logits of the last 1 or n positions only, (b, n, vocab) (a 64k prompt's full logits
            are GBs).
        doc_ids: None, or (b, t) int numbering packed documents along each row: every document runs as if alone
            (positions restart, token shifts and states reset at its first token)."""
        x = self.embeddings(input_ids)  # (b, t, d)
        v_first = torch.zeros_like(x)
        rope = None
        if not self.native:  # the attention cores rotate r and k; positions continue a cache's
            start = 0 if cache is None else cache[0].pos
            rope = model_positions(doc_ids, input_ids.shape[1], self.spec.rotary_dims, self.spec.rope_base, start,
                                   x.device)
        for i, block in enumerate(self.layers):
            if cache is not None:
                x, v_first = block(x, v_first, rope, cache[i])
            elif self.spec.checkpoint_activations and torch.is_grad_enabled():
                x, v_first = checkpoint(block, x, v_first, rope, None, doc_ids, use_reentrant=False)
            else:
                x, v_first = block(x, v_first, rope, doc_ids=doc_ids)
        x = self.norm(x)
        if targets is None:
            return self.lm_head(x[:, -int(last_only):] if last_only else x)  # (b, t or n, vocab)
        return loss_head(x, self.lm_head.weight, targets, reduction)  # (b, t) or () fp32


def to_fla(model: RWKV7):
    """The same network as FLA's `RWKV7ForCausalLM`, carrying this model's weights (native attention only).
    Used by the tests to check that we compute what FLA computes; needs fla and transformers."""
    from fla.models import RWKV7Config, RWKV7ForCausalLM
    spec = model.spec
    if native_mixing(spec.arch, spec.attention) is None:
        raise ValueError(f"to_fla: FLA's RWKV7 has only the native time mixing, not attention={spec.attention!r}")
    config = RWKV7Config(
        hidden_size=spec.d_model, num_hidden_layers=spec.n_layers, head_dim=spec.head_dim,
        vocab_size=spec.vocab_size, hidden_ratio=spec.mlp_ratio, decay_low_rank_dim=DECAY_RANK,
        gate_low_rank_dim=GATE_RANK, a_low_rank_dim=A_RANK, v_low_rank_dim=V_RANK, norm_eps=1e-5,
        tie_word_embeddings=False, fuse_norm=True, fuse_cross_entropy=False)
    fla_model = RWKV7ForCausalLM(config)
    state = {k if k == "lm_head.weight" else "model." + k: v for k, v in model.state_dict().items()}
    fla_model.load_state_dict(state, strict=True)
    return fla_model.to(next(model.parameters()).device)
