"""ModelSpec: every number that decides a model's shape, checked once at construction.

Fields follow docs/architecture.md. `build_model(spec)` (see `__init__.py`) turns a spec into an `nn.Module`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ARCHS = ("gpt2", "rwkv7")
ATTENTION_NAMES = ("exp", "power", "linear", "window")  # kept in sync with attention.ATTENTIONS (tested)

@dataclass
class ModelSpec:
    arch: str = "gpt2"                 # "gpt2" | "rwkv7"
    attention: str = "exp"             # "exp" | "power" | "linear" | "window"
    vocab_size: int = 50304
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    mlp_ratio: int = 4
    ctx: int = 1024                    # longest sequence the model will see (sizes the rotary table)
    p: int = 2                         # power attention degree
    window: int = 1024                 # sliding-window attention: keys per query, itself included
    chunk_size: Optional[int] = None   # power/linear chunk size; None = the kernel's choice
    gating: bool = True                # per-head learned gate for power/linear attention
    rope_base: float = 10000.0
    checkpoint_activations: bool = False

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"ModelSpec.{field}={getattr(self, field)!r}: {why}")

        if self.arch not in ARCHS:
            bad("arch", f"unknown architecture; known: {', '.join(ARCHS)}")
        if self.attention not in ATTENTION_NAMES:
            bad("attention", f"unknown attention; known: {', '.join(ATTENTION_NAMES)}")
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "ctx", "window"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(field, "must be a positive integer")
        if self.d_model % self.n_heads:
            bad("d_model", f"must be divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            bad("n_heads", f"head_dim = d_model/n_heads = {self.d_model // self.n_heads} must be even (rotary pairs)")
        if isinstance(self.p, bool) or not isinstance(self.p, int) or not 1 <= self.p <= 4:
            bad("p", "power degree must be an integer in 1..4")
        if self.chunk_size is not None and (
            isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1
        ):
            bad("chunk_size", "must be None (kernel's choice) or a positive integer")
        if not isinstance(self.rope_base, (int, float)) or isinstance(self.rope_base, bool) or self.rope_base <= 1:
            bad("rope_base", "must be a number > 1")
        for field in ("gating", "checkpoint_activations"):
            if not isinstance(getattr(self, field), bool):
                bad(field, "must be true or false")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads
