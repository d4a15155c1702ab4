"""GPT-2 with rotary position embeddings and a swappable attention core.

Radford et al. 2019 ("Language Models are Unsupervised Multitask Learners"), nanoGPT-style: pre-LayerNorm
blocks, MLP ratio 4 with GELU, tied input/output embeddings, init N(0, 0.02) with residual projections
scaled by 1/sqrt(2 * n_layers). Changed from GPT-2: no learned position embedding; rotary embeddings
(RoFormer) on queries and keys instead, and exact GELU. `arch.positions=learned` and `arch.activation=gelu_tanh`
restore GPT-2's own (a table of ctx positions, the tanh GELU), so a GPT-2 checkpoint maps exactly (longctx.hf).
The attention core comes from `build_attention(spec)` and is the only
thing that differs between exp / power / linear / window models. With `cache` (a list of per-layer
`LayerCache`, see decoding.py) the input continues the cached tokens: generation feeds one position at a time.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import build_attention
from .common import LanguageModelMixin, cached_token_shift, doc_positions, model_positions, rotary
from .context_parallel import ContextParallel, halo
from .registry import register_architecture
from .spec import ModelSpec


class SelfAttention(nn.Module):
    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.head_dim = spec.n_heads, spec.head_dim
        self.qkv = nn.Linear(spec.d_model, 3 * spec.d_model)
        # token shift (spec.token_shift): q, k and v each read x_t + mu * (x_{t-1} - x_t), mu learned per channel
        # and per projection, from 0 (the plain block); a key then carries its predecessor without a head for it
        self.shift_mix = nn.Parameter(torch.zeros(3 * spec.d_model)) if spec.token_shift else None
        self.core = build_attention(spec)
        self.proj = nn.Linear(spec.d_model, spec.d_model)
        self.proj.residual = True  # init scaled by 1/sqrt(2 * n_layers)

    def forward(self, x, rope, cache=None, doc_ids=None):
        """rope: the rotary tables of x's positions (the model's, shared by every layer); None: learned positions.
        doc_ids (b, t) int: packed documents (GPT2.forward)."""
        b, t, _ = x.shape
        qkv = self.project(x, cache, doc_ids).view(b, t, 3, self.n_heads, self.head_dim)
        if rope is None:
            q, k, v = qkv.unbind(2)
        elif cache is not None and cache.static:  # a static decoding step: q and k side by side, rotated in one pass
            q, k = rotary(qkv[:, :, :2].flatten(2, 3), rope).view(b, t, 2, self.n_heads, self.head_dim).unbind(2)
            v = qkv[:, :, 2]
        else:
            q, k, v = qkv.unbind(2)                                                # 3 x (b, t, h, d)
            q, k = rotary(q, rope), rotary(k, rope)
        if cache is None:
            # doc_ids only when packed: a core written for the interface (q, k, v, x) runs as before
            y = self.core(q, k, v, x) if doc_ids is None else self.core(q, k, v, x, doc_ids=doc_ids)  # (b, t, h, d)
        else:
            y, cache.state = self.core.decode(q, k, v, x, cache.state)
            if not cache.static:  # a static cache's position is shared by all layers: the decoder advances it
                cache.pos += t
        return self.proj(y.reshape(b, t, -1))                                       # (b, t, d_model)

    def project(self, x, cache=None, doc_ids=None):
        """q, k, v side by side (b, t, 3 d_model); with the token shift each from its own mix of x_t and x_{t-1}
        (the cache keeps the last token for the next call)."""
        if self.shift_mix is None:
            return self.qkv(x)
        if self.context_parallel is not None:  # the token before the slice lives on the previous rank
            before = halo(x, 1, self.context_parallel)                              # (b, 0 or 1, d)
            delta = F.pad(torch.cat([before, x[:, :-1]], dim=1), (0, 0, 1 - before.shape[1], 0)) - x
        else:
            delta = cached_token_shift(x, cache, "attn", doc_ids)                    # (b, t, d)
        mixed = x.unsqueeze(2) + delta.unsqueeze(2) * self.shift_mix.view(3, -1)     # (b, t, 3, d)
        w, bias = self.qkv.weight.view(3, -1, x.shape[-1]), self.qkv.bias.view(3, -1)
        out = torch.einsum("btjc,joc->btjo", mixed, w)          # bf16 under autocast, as self.qkv(x) would be
        # the bias in the matmul's dtype: an fp32 bias would promote q, k, v to fp32 under autocast, and attention
        # cores that take their inputs' dtype (power, linear, window) would run in fp32 (power p=2: 5x slower)
        return (out + bias.to(out.dtype)).flatten(2)


class MLP(nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.fc = nn.Linear(spec.d_model, spec.mlp_ratio * spec.d_model)
        self.proj = nn.Linear(spec.mlp_ratio * spec.d_model, spec.d_model)
        self.proj.residual = True
        self.approximate = "tanh" if spec.activation == "gelu_tanh" else "none"

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


class Block(nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.d_model)
        self.attn = SelfAttention(spec)
        self.ln_2 = nn.LayerNorm(spec.d_model)
        self.mlp = MLP(spec)

    def forward(self, x, rope, cache=None, doc_ids=None):
        x = x + self.attn(self.ln_1(x), rope, cache, doc_ids)
        x = x + self.mlp(self.ln_2(x))
        return x


@register_architecture("gpt2")
class GPT2(LanguageModelMixin, nn.Module):
    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.ctx, spec.d_model) if spec.positions == "learned" else None
        self.blocks = nn.ModuleList([Block(spec) for _ in range(spec.n_layers)])
        self.ln_f = nn.LayerNorm(spec.d_model)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    def forward(self, input_ids, targets=None, cache=None, last_only=False, reduction="none", doc_ids=None):
        """input_ids (b, t) int64 -> logits (b, t, vocab); with targets (b, t): per-token NLL (b, t) fp32, or with
        reduction="sum" its sum (the trainer's loss: a backward without recomputation, common.nll_sum).
        cache: per-layer decoding caches (`new_cache()`), updated in place; input_ids continue their tokens.
        last_only: True or n: logits of the last 1 or n positions only, (b, n, vocab) (a 64k prompt's full logits
            are GBs).
        doc_ids: None, or (b, t) int numbering packed documents along each row: every document runs as if alone
            (positions restart, attention and state stay within it)."""
        x = self.wte(input_ids)  # (b, t, d_model)
        start = self.first_position(input_ids.shape[1], cache)
        if self.wpe is None:
            rope = model_positions(doc_ids, input_ids.shape[1], self.spec.rotary_dims, self.spec.rope_base, start,
                                   x.device)
        else:  # learned positions: the table ends at ctx (a static decoder's position is a tensor, read on device)
            if not isinstance(start, torch.Tensor) and start + input_ids.shape[1] > self.wpe.num_embeddings:
                raise ValueError(f"positions up to {start + input_ids.shape[1]}: arch.positions=learned holds "
                                 f"ctx={self.wpe.num_embeddings} positions")
            rope = None
            x = x + self.wpe(start + torch.arange(input_ids.shape[1], device=x.device) if doc_ids is None
                             else doc_positions(doc_ids))
        x = self.ln_f(self.run_blocks(x, rope, cache, doc_ids))
        return self.head(x, targets, last_only, reduction)  # (b, t or n, vocab), or (b, t) / () fp32
