"""Context parallelism for power attention: a sequence split along time over the ranks of a process group
computes what one process computes on the whole sequence (outputs and gradients of q, k, v, log_g), to round-off.

Layout: rank r of `group` holds the contiguous slice of tokens that follows rank r-1's (q, k, v (b, t_r, h, d),
log_g (b, t_r, hk)). Slices may differ in length and need not be multiples of any chunk size: the states the ranks
exchange have the same size whatever t_r is.

Why it is exact: the output of query i only depends on the keys before its slice through the state at the slice's
start, S = sum_j phi_w(k_j) e^(G_start - G_j) v_j^T (and the normalizer z, the same with v = 1): the public entry
point takes that state as `initial_state`. The state of a concatenation is a gated sum of the states of its parts:

    S_prefix(r) = sum_{j<r} exp(L_{j+1} + ... + L_{r-1}) S_j,     L_j = sum of log_g over slice j (per (b, hk)),

where S_j is slice j's state from a zero state, gated to its own last token (`return_state=True`).

Steps per rank:
1. S_r, z_r = power_attention(slice, return_state=True).state (from a zero state), and L_r. The last rank's state is
   needed by no one: it sends zeros and skips this pass; rank 0 keeps this pass's output (it has no prefix).
2. One all-gather of (S_r, z_r, L_r): b * hk * (D*d + D + 1) numbers per rank (z only with norm), independent of the
   slice length; no serial send/recv chain, so the latency is one collective whatever the world size. It is
   `differentiable_all_gather` (backward: a reduce-scatter on NCCL, an all-reduce on gloo). Not torch's
   torch.distributed.nn.functional.all_gather: its gloo backward passes group ranks where global ranks belong and
   fails in a group that does not start at global rank 0 (a context-parallel group of a DP x CP layout); nor the
   functional collectives' all_gather_single, which here (gloo, CPU) imported torch._dynamo on its first call (3-8 s
   a process) and aborted 1 process exit in 4.
3. The gated prefix sum above over the ranks before r (exponents summed directly, no differences of cumsums).
4. y_r = power_attention(slice, initial_state=prefix). Middle ranks run their slice twice (steps 1 and 4: the entry
   point has no state-only call), rank 0 and the last rank once; the exchange waits for the slowest step 1.

Backward: autograd through all of it. The all-gather is differentiable, so the gradients reaching a gathered state
return, summed over the ranks that read it, to the rank that made it; `power_attention` is differentiable in
`initial_state` (reference path: torch autograd; CUDA chunked form: dS_0, not tested here). Every rank must run
the all-gather's backward: rank 0's output does not depend on the gathered states, so it is tied to them (_Tie,
zero gradient), and the last rank's zeros are tied to its k, v, log_g, so the collective's node exists on each rank
exactly when the states need gradients (k, v or log_g require grad on every rank alike).

Ranks must agree on batch, heads, head dim, dtype, p, norm, scale and gating: one small all-gather checks that (and
that every rank's own inputs passed the checks) before the state exchange, so a bad input raises a ValueError on
every rank instead of leaving the others waiting in a collective; `check_group=False` skips it.

Normalized outputs (norm=True): the reference adds its EPS guard to a stabilized denominator whose stabilizer
depends on where the state starts, so outputs differ from one process's at the EPS level (<= 1e-6 relative; the
guard itself moves one process's dq by ~3e-5 at p=4), as one process's do between chunk sizes; with EPS = 0 they
agree to round-off.

Linear attention (models.attention.linear) is p=1, norm=False through the same entry point (its per-head RMSNorm
acts per token, after the attention), so this covers its CPU / Triton path; on CUDA it prefers FLA's
chunk_simple_gla, which this does not call.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .interface import check_inputs, power_attention
from .reference import PowerState, state_dim

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# what the ranks must agree on, in the order of _agree's numbers after the ok flag
_AGREE = ("batch (q.shape[0])", "q heads (q.shape[2])", "k heads (k.shape[2])", "head_dim (q.shape[3])", "q dtype",
          "p", "norm", "log_g (given on some ranks only)", "scale")


class _Tie(torch.autograd.Function):
    """Returns x; `deps` join the graph with zero gradients, so a backward through x also runs the nodes that made
    deps (here: the all-gather, whose backward is a collective every rank must enter)."""

    @staticmethod
    def forward(ctx, x, *deps):
        ctx.deps = [(d.shape, d.dtype, d.device) for d in deps]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g, *(torch.zeros(s, dtype=dt, device=dev) for s, dt, dev in ctx.deps))


class _AllGather(torch.autograd.Function):
    """All-gather whose backward sums, over the ranks, the gradients of each rank's piece and returns them to it: a
    reduce-scatter on NCCL; on gloo (no reduce-scatter) an all-reduce of every piece's gradient, keeping this rank's.
    (torch.distributed.nn.functional.all_gather's gloo backward passes group ranks where global ranks belong, so it
    fails in a group that does not start at global rank 0: a CP group of a DP x CP layout.)"""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads):
        stacked = torch.stack(grads)                                            # (world, *x.shape)
        if dist.get_backend(ctx.group) == dist.Backend.NCCL:
            mine = torch.empty_like(grads[0])
            dist.reduce_scatter_tensor(mine, stacked, group=ctx.group)
        else:
            dist.all_reduce(stacked, group=ctx.group)
            mine = stacked[dist.get_rank(ctx.group)]
        return None, mine


def tie(x: torch.Tensor, *deps: torch.Tensor) -> torch.Tensor:
    """x, with `deps` in its graph at zero gradient: a rank that uses none of a collective's outputs still enters
    that collective's backward (every rank must)."""
    return _Tie.apply(x, *deps)


def differentiable_all_gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's x in `group` (same shape everywhere), in rank order; gradients return to the rank that sent each."""
    return list(_AllGather.apply(group, x))


def _group_rank(group):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialized (call init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _agree(q, k, v, log_g, p, scale, chunk_size, norm, group, world):
    """Local input checks, then one all-gather of what the ranks must agree on; raises ValueError on every rank."""
    error = None
    try:
        b, _, hq, hk, d = check_inputs(q, k, v, log_g, p, scale, chunk_size, norm, None)
        meta = [0.0, b, hq, hk, d, _DTYPES.index(q.dtype), p, float(bool(norm)), float(log_g is not None),
                float(d ** -0.5 if scale is None else scale)]
    except ValueError as err:
        error = err
        meta = [1.0] + [0.0] * len(_AGREE)
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    mine = torch.tensor(meta, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    if error is not None:
        raise error
    every = torch.stack(every).cpu()
    bad = (every[:, 0] != 0).nonzero()
    if len(bad):
        raise ValueError(f"rank {int(bad[0])} of the group refused its inputs (its ValueError names the argument)")
    for i, name in enumerate(_AGREE, start=1):
        if (every[:, i] != every[0, i]).any():
            vals = [x.item() for x in every[:, i]]
            vals = [str(_DTYPES[int(x)]) if name == "q dtype" else int(x) if x.is_integer() else x for x in vals]
            raise ValueError(f"{name} differs across the ranks of the group (rank order): {vals}")


def _prefix(gathered, rank, b, hk, D, d, norm, like):
    """The gated prefix state of `rank` from the gathered (S_j, z_j, L_j) of every rank."""
    n_s, n_z = b * hk * D * d, (b * hk * D if norm else 0)
    parts = torch.stack(gathered[:rank])                                     # (rank, n)
    S = parts[:, :n_s].reshape(rank, b, hk, D, d)
    L = parts[:, n_s + n_z:].reshape(rank, b, hk)
    # exponent of slice j: L_{j+1} + ... + L_{rank-1}, a suffix sum (0 for the slice just before)
    expo = torch.cat([L[1:].flip(0).cumsum(0).flip(0), torch.zeros_like(L[:1])])
    w = expo.exp()                                                           # (rank, b, hk)
    s = (w[..., None, None] * S).sum(0)
    if norm:
        z = (w[..., None] * parts[:, n_s:n_s + n_z].reshape(rank, b, hk, D)).sum(0)
    else:                                                                    # unread without norm: not sent
        z = like.new_zeros(b, hk, D)
    return PowerState(s, z)


def context_parallel_power_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     log_g: Optional[torch.Tensor] = None, *, p: int = 2,
                                     scale: Optional[float] = None, chunk_size: Optional[int] = None,
                                     norm: bool = True, group=None, check_group: bool = True) -> torch.Tensor:
    """Power attention over a sequence split along time across the ranks of `group` (module docstring).

    Args:
        q (b, t_r, hq, d), k / v (b, t_r, hk, d), log_g (b, t_r, hk) or None: this rank's slice, the tokens right
            after those of the rank before it (rank order of `group`); t_r may differ between ranks.
        p, scale, chunk_size, norm: as `power_attention` (chunk_size applies within each rank's slice). Linear
            attention is p=1, norm=False.
        group: the process group (None: the default group); every rank of it must call this function.
        check_group: check that the ranks agree on shapes and arguments (one small all-gather) first.
    Returns:
        y (b, t_r, hq, d): this rank's slice of the output of power_attention on the whole sequence.

    Example (each of R processes, after init_process_group):
        >>> y = context_parallel_power_attention(q[:, r * T // R:(r + 1) * T // R], ..., p=2)
    """
    rank, world = _group_rank(group)
    if check_group:
        _agree(q, k, v, log_g, p, scale, chunk_size, norm, group, world)
    kw = dict(p=p, scale=scale, chunk_size=chunk_size, norm=norm)
    if world == 1:
        return power_attention(q, k, v, log_g, **kw)
    b, _, _, d = q.shape
    hk = k.shape[2]
    D = state_dim(p, d)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32       # the states' dtype
    last = rank == world - 1
    y = None
    if last:    # its state would reach no one: zeros, tied to what a state depends on (see module docstring)
        n = b * hk * (D * d + (D if norm else 0) + 1)
        deps = [x for x in (k, v, log_g) if x is not None and x.requires_grad]
        mine = q.new_zeros(n, dtype=cdt)
        if deps and torch.is_grad_enabled():
            mine = _Tie.apply(mine, *deps)
    else:
        y0, st = power_attention(q, k, v, log_g, return_state=True, **kw)
        y = y0 if rank == 0 else None
        L = (torch.zeros(b, hk, dtype=cdt, device=q.device) if log_g is None
             else log_g.double().sum(1).to(cdt))                             # float64 sum over the slice
        mine = torch.cat([st.s.to(cdt).reshape(-1)] + ([st.z.to(cdt).reshape(-1)] if norm else [])
                         + [L.reshape(-1)])
    gathered = differentiable_all_gather(mine, group or dist.group.WORLD)
    if rank == 0:
        if gathered[0].requires_grad:
            y = _Tie.apply(y, *gathered)
        return y
    prefix = _prefix(gathered, rank, b, hk, D, d, norm, mine)
    return power_attention(q, k, v, log_g, initial_state=prefix, **kw)
