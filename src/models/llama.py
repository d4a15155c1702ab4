"""Llama-style decoder with a swappable attention core: the layout of Llama and Qwen2 checkpoints.

Touvron et al. 2023 ("LLaMA: Open and Efficient Foundation Language Models"), as Hugging Face's
`LlamaForCausalLM` computes it: pre-RMSNorm blocks, rotary embeddings (rotate-half convention,
`common.rotary`, HF's `apply_rotary_pos_emb`), a SwiGLU MLP (`down(silu(gate(x)) * up(x))`), no biases, and
grouped-query attention with `n_kv_heads` key/value heads. Options: `tie_embeddings` (the LM head is the input
embedding, as small Llama 3.2 and Qwen2 checkpoints have it) and `qkv_bias` (Qwen2's biases on q, k, v).

Grouped-query attention: the attention cores take as many key/value heads as query heads, so each key/value head
is repeated for its group of query heads before the core (query head i reads key/value head i // group, as HF's
`repeat_kv`). The projections keep n_kv_heads (the parameters and their FLOPs are GQA's); the core's state and its
accounting are those of n_heads heads. Init as GPT-2 here: N(0, 0.02), output projections scaled by
1/sqrt(2 * n_layers).
"""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from .attention import build_attention
from .common import LanguageModelMixin, model_positions, rotary
from .context_parallel import ContextParallel
from .registry import register_architecture
from .spec import ModelSpec


class SelfAttention(nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = spec.n_heads, spec.kv_heads, spec.head_dim
        self.q = nn.Linear(spec.d_model, spec.n_heads * spec.head_dim, bias=spec.qkv_bias)
        self.k = nn.Linear(spec.d_model, spec.kv_heads * spec.head_dim, bias=spec.qkv_bias)
        self.v = nn.Linear(spec.d_model, spec.kv_heads * spec.head_dim, bias=spec.qkv_bias)
        self.core = build_attention(spec)
        self.o = nn.Linear(spec.d_model, spec.d_model, bias=False)
        self.o.residual = True  # init scaled by 1/sqrt(2 * n_layers)

    def forward(self, x, rope, cache=None, doc_ids=None):
        """rope: the rotary tables of x's positions (the model's, shared by every layer). doc_ids (b, t) int: packed
        documents (Llama.forward)."""
        b, t, _ = x.shape
        q = rotary(self.q(x).view(b, t, self.n_heads, self.head_dim), rope)         # (b, t, h, d)
        k = rotary(self.k(x).view(b, t, self.kv_heads, self.head_dim), rope)        # (b, t, h_kv, d)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim)
        if self.kv_heads != self.n_heads:  # each key/value head serves its group of query heads
            group = self.n_heads // self.kv_heads
            k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)  # (b, t, h, d)
        if cache is None:
            y = self.core(q, k, v, x, doc_ids=doc_ids)                              # (b, t, h, d)
        else:
            y, cache.state = self.core.decode(q, k, v, x, cache.state)
            if not cache.static:  # a static cache's position is shared by all layers: the decoder advances it
                cache.pos += t
        return self.o(y.reshape(b, t, -1))                                          # (b, t, d_model)


class MLP(nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gate = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.up = nn.Linear(spec.d_model, spec.ffn_dim, bias=False)
        self.down = nn.Linear(spec.ffn_dim, spec.d_model, bias=False)
        self.down.residual = True

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attn_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.attn = SelfAttention(spec)
        self.mlp_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, rope, cache=None, doc_ids=None):
        x = x + self.attn(self.attn_norm(x), rope, cache, doc_ids)
        x = x + self.mlp(self.mlp_norm(x))
        return x


@register_architecture("llama")
class Llama(LanguageModelMixin, nn.Module):
    context_parallel: ContextParallel | None = None  # set by models.context_parallel.set_context_parallel

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.blocks = nn.ModuleList([Block(spec) for _ in range(spec.n_layers)])
        self.norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.lm_head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    def forward(self, input_ids, targets=None, cache=None, last_only=False, reduction="none", doc_ids=None):
        """input_ids (b, t) int64 -> logits (b, t, vocab); with targets (b, t): per-token NLL (b, t) fp32, or with
        reduction="sum" its sum. cache, last_only, doc_ids: as GPT2.forward."""
        x = self.wte(input_ids)  # (b, t, d_model)
        start = self.first_position(input_ids.shape[1], cache)
        rope = model_positions(doc_ids, input_ids.shape[1], self.spec.rotary_dims, self.spec.rope_base, start,
                               x.device)
        x = self.norm(self.run_blocks(x, rope, cache, doc_ids))
        return self.head(x, targets, last_only, reduction)
