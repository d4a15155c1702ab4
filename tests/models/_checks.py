"""Checks shared by the architecture tests."""
import dataclasses

import pytest
import torch

from longctx.models import ARCHITECTURES, ATTENTIONS, ModelSpec, native_mixing

VOCAB = 37


def tiny_spec(default_arch: str, **kw) -> ModelSpec:
    """A two-layer, 32-wide model (CPU-sized) of `default_arch`, with any field (arch too) overridden by `kw`.
    Keywords that are not ModelSpec fields (p=3, window=8, output_norm=True) are the attention's parameters;
    window 5 and chunk size 8 by default, where the attention has them, so the windowed and chunked paths run."""
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    spec = dict(arch=default_arch, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, ctx=64)
    spec.update((k, v) for k, v in kw.items() if k in fields)
    cls = ATTENTIONS.get(spec.get("attention", "exp"))
    declared = {f.name for f in dataclasses.fields(cls.Params)} if cls else set()
    params = {k: v for k, v in dict(window=5, chunk_size=8).items() if k in declared}
    params.update((k, v) for k, v in kw.items() if k not in fields)
    return ModelSpec(**spec, attention_params=params)


# Architectures whose pairs run in the slow suite but for attention=exp: llama holds the cores as GPT-2 does (its
# checks against transformers' own model, GQA included, are tests/hf/test_import.py)
SLOW_ARCHS = ("llama",)


def arch_params() -> list:
    """Every registered architecture as a pytest param, those of SLOW_ARCHS in the slow suite."""
    return [pytest.param(arch, id=arch, marks=[pytest.mark.slow] if arch in SLOW_ARCHS else [])
            for arch in sorted(ARCHITECTURES)]


def model_cases() -> list:
    """Every (arch, attention) pair of the registries as pytest params: each registered attention on each registered
    architecture. Where an architecture serves an attention name with a native mixing of its own, the id says so
    (rwkv7-linear[native rwkv7]). Pairs of SLOW_ARCHS but exp run in the slow suite."""
    cases = []
    for arch in sorted(ARCHITECTURES):
        for attention in sorted(ATTENTIONS):
            native = native_mixing(arch, attention)
            slow = arch in SLOW_ARCHS and attention != "exp"
            cases.append(pytest.param(arch, attention, id=f"{arch}-{attention}"
                                      + (f"[native {native.name}]" if native else ""),
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


def native_attention(arch: str) -> str:
    """The attention name that architecture `arch` serves with its native mixing."""
    served = [a for a in sorted(ATTENTIONS) if native_mixing(arch, a)]
    assert served, f"{arch} has no native mixing"
    return served[0]


def assert_causal(model, vocab: int, min_change: float, t: int = 23, at: int = 13) -> None:
    """Changing the token at position `at` leaves every earlier output exactly as it was and moves a later one."""
    x = torch.randint(0, vocab, (1, t))
    y = x.clone()
    y[0, at] = (x[0, at] + 1) % vocab
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :at], b[:, :at], rtol=0, atol=1e-6)
    assert (a[:, at:] - b[:, at:]).abs().max() > min_change


def perturb_(model, scale: float, seed: int = 1):
    """Add seeded N(0, scale^2) noise to every parameter (RWKV's init zeroes several paths, which would make
    comparisons vacuous); CPU generator, so CPU and GPU copies get the same weights. Returns the model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device, p.dtype))
    return model


def assert_cached_equals_full(model, x, prompt: int, atol: float):
    """A `prompt`-token prefix, then one token at a time through the model's caches: the logits of every position
    equal one forward over the whole of x (positions, states and token shifts continue across calls). Returns the
    full forward's logits and the caches."""
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model(x[:, :prompt], cache=cache)] + [model(x[:, i:i + 1], cache=cache)
                                                       for i in range(prompt, x.shape[1])]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=atol)
    return full, cache
