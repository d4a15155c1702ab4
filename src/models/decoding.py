"""Autoregressive generation, with per-layer decoding caches or by recomputing the whole prefix.

With caches, the prompt runs once through `model(prompt, cache=caches)` and every new token is one call with a
single position; each layer keeps what its attention needs to continue (models/attention/: a KV cache for exp,
the rolling window for window, the constant-size recurrent state for power/linear; RWKV7 adds its token-shift
inputs and its own recurrent state). Without caches every step is a full forward over the sequence so far:
slower, and the independent check that the caches compute the same thing (tests/models/test_decoding.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LayerCache:
    """One layer's decoding state."""
    pos: int = 0                                  # tokens consumed: the position (rotary offset) of the next one
    state: object = None                          # the attention core's own state (None before the first token)
    shift: dict = field(default_factory=dict)     # the architecture's extras (RWKV7: its token-shift inputs)


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(b, vocab) logits -> (b, 1) next ids: greedy (argmax) when temperature is 0, else a sample from
    softmax(logits / temperature), restricted to the top_k most likely ids when top_k is set."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def check_generate_args(model, idx, max_new_tokens, temperature, top_k) -> None:
    """ValueError naming the argument for every bad input (token ids outside the vocabulary included)."""
    vocab = model.spec.vocab_size
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"idx must be a (batch, seq) integer tensor, got "
                         f"{tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__}")
    if idx.shape[1] < 1:
        raise ValueError("idx must hold at least one token (the prompt)")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab):
        bad = int(idx.max()) if int(idx.max()) >= vocab else int(idx.min())
        raise ValueError(f"idx: token id {bad} is outside the model's vocabulary 0..{vocab - 1}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive integer, got {top_k!r}")


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue idx (b, t) int64 by `max_new_tokens` tokens -> (b, t + max_new_tokens).

    temperature: softmax temperature; 0 = greedy (argmax). top_k: sample among the k most likely ids only.
    use_cache: decode with per-layer caches (constant work per token for power/linear/window) instead of
    recomputing the whole prefix for every token. generator: a torch.Generator for reproducible sampling.
    Runs under the caller's autocast, if any; the model is put in eval mode and left there.

    Example:
        >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=20, temperature=0)
    """
    check_generate_args(model, idx, max_new_tokens, temperature, top_k)
    model.eval()
    idx = idx.long()
    if max_new_tokens == 0:
        return idx
    if not use_cache:
        for _ in range(max_new_tokens):
            logits = model(idx, last_only=True)[:, -1]                   # the whole prefix, every token
            idx = torch.cat([idx, sample_next(logits, temperature, top_k, generator)], dim=1)
        return idx
    cache = model.new_cache()
    logits = model(idx, cache=cache, last_only=True)[:, -1]             # the prompt, once
    out = [idx]
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)        # (b, 1)
        out.append(nxt)
        if i + 1 < max_new_tokens:
            logits = model(nxt, cache=cache)[:, -1]                      # one position against the caches
    return torch.cat(out, dim=1)
