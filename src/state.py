"""State accounting in one place: how many floats of recurrent or KV state one layer holds for one sequence.

The paper's definitions (Sections 2 and 5, Appendix "Symmetric power"): softmax's state is its KV cache, t (d + v) a
head at context t; a sliding window's the last w keys and values, min(t, w) (d + v); linear attention's
S in R^{d x v}; power attention's S in R^{D x v} with D = C(d + p - 1, p), the symmetric power's dimension
(2080 at d = 64, p = 2). The kernels store a tiled symmetric power (`longctx.kernels.power.reference.state_dim`:
2304 at d = 64, p = 2) and, for even p, a D-long normalizer; `definition="tiled"` counts what they store.

    state_per_layer("power", d_model=768, n_heads=12, ctx=4096, p=2)      # 12 heads x 2080 x 64
    equal_state_window(p=2, head_dim=64)                                  # 1040: w (d + v) = D v

Experiment configs derive their equal-state windows from here: `window: ${longctx.equal_state_window:2,64}`.
"""
from __future__ import annotations

from math import comb

ATTENTIONS = ("exp", "window", "linear", "power")
DEFINITIONS = ("paper", "tiled")
RESOLVER = "longctx.equal_state_window"


def power_dim(p: int, head_dim: int, definition: str = "paper") -> int:
    """D: C(d + p - 1, p) (the paper's), or the tiled symmetric power the kernels store (`tiled`)."""
    _check(p=p, head_dim=head_dim, definition=definition)
    if definition == "paper":
        return comb(head_dim + p - 1, p)
    from longctx.kernels.power import state_dim  # imported on use: configs resolve the paper's without torch

    return state_dim(p, head_dim)


def state_per_layer(attention: str, *, d_model: int, n_heads: int, ctx: int, p: int = 2, window: int | None = None,
                    definition: str = "paper") -> int:
    """Floats of state one layer holds for one sequence at context `ctx` (keys and values of equal width
    d = v = d_model / n_heads). `tiled` adds what the kernels keep beside the paper's S: power's tiled D and,
    for even p (normalized), the D-long normalizer of every head."""
    _check(definition=definition)
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: expected one of {', '.join(ATTENTIONS)}")
    if d_model % n_heads:
        raise ValueError(f"model.d_model={d_model} is not a multiple of model.n_heads={n_heads}")
    d = d_model // n_heads
    if attention == "exp":
        return n_heads * ctx * 2 * d
    if attention == "window":
        if window is None or window < 1:
            raise ValueError(f"window={window!r}: a window attention needs a positive window")
        return n_heads * min(ctx, window) * 2 * d
    if attention == "linear":
        return n_heads * d * d
    D = power_dim(p, d, definition)
    return n_heads * D * (d + int(definition == "tiled" and p % 2 == 0))


def equal_state_window(p: int, head_dim: int, definition: str = "paper") -> int:
    """The window w whose state equals power attention's of degree p (p = 1: linear's): w (d + v) = D v, rounded."""
    D = head_dim if p == 1 else power_dim(p, head_dim, definition)
    v = head_dim + int(definition == "tiled" and p % 2 == 0)
    return max(1, round(D * v / (2 * head_dim)))


def _check(p: int = 1, head_dim: int = 1, definition: str = "paper") -> None:
    if definition not in DEFINITIONS:
        raise ValueError(f"definition={definition!r}: expected one of {', '.join(DEFINITIONS)}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r}: must be a positive integer")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim={head_dim!r}: must be a positive integer")


def register() -> None:
    """`${longctx.equal_state_window:p,head_dim[,definition]}` in configs (done on `import longctx`)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda p, d, definition="paper":
                                        equal_state_window(int(p), int(d), str(definition)))
