"""The one place that wires forward and backward of the Triton forms.

Eager calls run torch.autograd.Functions: AttentionForm (the attention form; its gate scan inside the node, since at
short t every node and torch op is host time) and ChunkedForm (the chunked form, with state in and out). Under
torch.compile a stateless call runs as torch.library custom ops instead: dynamo cannot trace the kernels' Python
launch code (tables, caches, grids), so a call would split the graph around every attention layer; as custom ops each
pass is one opaque node with a shape-only fake, the graph stays whole and the compiler fuses the code around the
layer. A custom op costs extra host time per call, which short sequences feel, so eager calls keep the Functions.

Each custom-op form has a forward op returning the output and the tensors its backward needs, and a backward op; the
pair is joined by register_autograd. Optional tensors (log_g) are Optional[Tensor]; a missing gradient comes back as
an empty tensor and is turned into None.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import gates
from .chunk import chunked_backward, chunked_forward
from .native import launcher as native
from .parallel import attention_backward, attention_forward
from .plan import Plan, make_plan, state_dtype
from .reference import PowerState, state_dim, symmetrize_diagonal_blocks

_F32 = torch.float32


# ----------------------------------------------------------------------------------------------------------
# attention form
@torch.library.custom_op("longctx::power_attention_form_fwd", mutates_args=())
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor], scale: float,
                   p: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    o, lse, G = attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), log_g, scale, p, norm)
    # the unread 1-element dummies are uninitialized (no fill launch in eager); an op's outputs must be
    # deterministic (opcheck compares eager with traced runs)
    return o, lse if norm else lse.zero_(), G if log_g is not None else G.zero_()


@_attention_fwd.register_fake
def _(q, k, v, log_g, scale, p, norm):
    b, t, hq, _ = q.shape
    lse = q.new_empty((b, t, hq) if norm else (1,), dtype=_F32)
    G = q.new_empty((b, t, k.shape[2]) if log_g is not None else (1,), dtype=_F32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), lse, G


@torch.library.custom_op("longctx::power_attention_form_bwd", mutates_args=())
def _attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: torch.Tensor,
                   o: torch.Tensor, lse: torch.Tensor, scale: float, p: int, norm: bool,
                   gated: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, dlog_g = attention_backward(do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), G, o,
                                            lse, scale, p, norm, gated)
    return dq, dk, dv, dlog_g if gated else q.new_empty(0, dtype=_F32)


@_attention_bwd.register_fake
def _(do, q, k, v, G, o, lse, scale, p, norm, gated):
    dlog_g = G.new_empty(G.shape if gated else (0,))
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)), dlog_g)


def _attention_setup(ctx, inputs, output):
    q, k, v, log_g, scale, p, norm = inputs
    o, lse, G = output
    ctx.save_for_backward(q, k, v, G, o, lse)
    ctx.cfg = (scale, p, norm, log_g is not None)


def _attention_grad(ctx, do, _dlse, _dG):
    q, k, v, G, o, lse = ctx.saved_tensors
    scale, p, norm, gated = ctx.cfg
    dq, dk, dv, dlog_g = _attention_bwd(do, q, k, v, G, o, lse, scale, p, norm, gated)
    return dq, dk, dv, dlog_g if gated else None, None, None, None


_attention_fwd.register_autograd(_attention_grad, setup_context=_attention_setup)


def attention_form_op(q, k, v, log_g, scale: float, p: int, norm: bool) -> torch.Tensor:
    """attention_form as custom ops (same semantics)."""
    return _attention_fwd(q, k, v, log_g, scale, p, norm)[0]


# ----------------------------------------------------------------------------------------------------------
# chunked form (stateless; t a multiple of the chunk C: chunked_form pads before calling)
@torch.library.custom_op("longctx::power_chunked_form_fwd", mutates_args=())
def _chunked_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_g: Optional[torch.Tensor], scale: float,
                 p: int, norm: bool, C: int, family: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                  torch.Tensor, torch.Tensor]:
    gl = None if log_g is None else gates.segment_scan(log_g, C)                    # chunk-local G
    y, S, Z, lse, G = chunked_forward(q.contiguous(), k.contiguous(), v.contiguous(), gl, None, None, scale, p, norm,
                                      C, family)
    return y, S, Z, lse, G.clone() if G is lse else G      # ungated and not norm: one dummy; op outputs may not alias


@_chunked_fwd.register_fake
def _(q, k, v, log_g, scale, p, norm, C, family):
    b, T, hq, d = q.shape
    d = int(d)                                    # the head dim is static (kernel constexpr); state_dim caches
    hk, ds = k.shape[2], state_dim(p, d)
    S = q.new_empty((b, hk, T // C + 1, ds, d), dtype=state_dtype(family, q.dtype))
    Z = q.new_empty((b, hk, T // C + 1, ds), dtype=_F32)
    lse = q.new_empty((b, T, hq) if norm else (1,), dtype=_F32)
    G = q.new_empty((b, T, hk) if log_g is not None else (1,), dtype=_F32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), S, Z, lse, G


@torch.library.custom_op("longctx::power_chunked_form_bwd", mutates_args=())
def _chunked_bwd(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, G: torch.Tensor,
                 S: torch.Tensor, Z: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, scale: float, p: int,
                 norm: bool, gated: bool, C: int,
                 family: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # the final state is not an output here: its gradients are None (zeros in the kernels' slot)
    dq, dk, dv, dgl, _, _ = chunked_backward(dy, None, None, q.contiguous(), k.contiguous(), v.contiguous(), G, S, Z,
                                             y, lse, scale, p, norm, gated, C, False, family)
    dlog_g = gates.segment_scan(dgl, C, reverse=True) if gated else q.new_empty(0, dtype=_F32)
    return dq, dk, dv, dlog_g


@_chunked_bwd.register_fake
def _(dy, q, k, v, G, S, Z, y, lse, scale, p, norm, gated, C, family):
    dlog_g = G.new_empty(G.shape if gated else (0,))
    return (*(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)), dlog_g)


def _chunked_setup(ctx, inputs, output):
    q, k, v, log_g, scale, p, norm, C, family = inputs
    y, S, Z, lse, G = output
    ctx.save_for_backward(q, k, v, G, S, Z, y, lse)
    ctx.cfg = (scale, p, norm, log_g is not None, C, family)


def _chunked_grad(ctx, dy, *_unused):
    q, k, v, G, S, Z, y, lse = ctx.saved_tensors
    dq, dk, dv, dlog_g = _chunked_bwd(dy, q, k, v, G, S, Z, y, lse, *ctx.cfg)
    return dq, dk, dv, dlog_g if ctx.cfg[3] else None, None, None, None, None, None


_chunked_fwd.register_autograd(_chunked_grad, setup_context=_chunked_setup)


def chunked_form_op(q, k, v, log_g, scale: float, p: int, norm: bool, C: int, family: str) -> torch.Tensor:
    """ChunkedForm (stateless) with the chunk-local gate scan, as custom ops; t % C == 0; family: the plan's."""
    return _chunked_fwd(q, k, v, log_g, scale, p, norm, C, family)[0]


# ----------------------------------------------------------------------------------------------------------
# eager autograd Functions
class AttentionForm(torch.autograd.Function):
    """y = power attention (attention form). q (b,t,hq,d), k/v (b,t,hk,d), log_g (b,t,hk) or None. The gate cumsum
    G and, in the backward, its reverse scan (which also sums the query heads' gate gradients per GQA group) run
    inside this one autograd node: at short t every node and torch op is host time (docs/kernels.md). Under
    torch.compile the same passes run as the custom ops above. record: native.lookup's recorder (the compiled
    kernels become a plan for the C++ node, native/launcher.py)."""

    @staticmethod
    def forward(ctx, q, k, v, log_g, scale, p, norm, record=None):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, lse, Gc = attention_forward(q, k, v, log_g, scale, p, norm, record)
        ctx.save_for_backward(q, k, v, Gc, o, lse)
        ctx.cfg = (scale, p, norm, log_g is not None)
        ctx.record = record if record is not None and record["grad"] else None
        if record is not None and not record["grad"]:
            native.register(record, q, k, norm, log_g is not None, backward=False)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, Gc, o, lse = ctx.saved_tensors
        dq, dk, dv, dlog_g = attention_backward(do.contiguous(), q, k, v, Gc, o, lse, *ctx.cfg, record=ctx.record)
        if ctx.record is not None:
            native.register(ctx.record, q, k, ctx.cfg[2], ctx.cfg[3], backward=True)
        return dq, dk, dv, dlog_g, None, None, None, None


def attention_form(q, k, v, log_g, *, p, scale, norm, plan: Optional[Plan] = None):
    """Triton attention form (no incoming/outgoing state). log_g (b,t,hk) or None. plan: the call's (power_attention
    makes it; None: the attention form's plan for these inputs). On CUDA the C++ node (native/launcher.py) runs it once
    the extension is built and this specialization's kernels are known."""
    if plan is None:
        plan = make_plan(q.shape[1], p, q.shape[-1], q.dtype, q.device.type, norm=norm, form="attention")
    if plan.launcher == "custom_op":      # dynamo cannot trace the launches: one opaque op per pass
        return attention_form_op(q, k, v, log_g, float(scale), int(p), bool(norm))
    scale, p, norm = float(scale), int(p), bool(norm)
    node, record = native.lookup(q, k, v, log_g, p, norm)      # the C++ node's launch plan, once recorded
    if node is not None:
        return native.run(node, q, k, v, log_g, scale, p)
    return AttentionForm.apply(q, k, v, log_g, scale, p, norm, record)


def python_node(plan: Plan, q, k, v, log_g, scale: float) -> torch.Tensor:
    """The attention form's Python autograd node (AttentionForm) for an attention-form plan, neither the C++ node nor
    the custom ops: what tools/host_overhead*.py time beside an empty node."""
    if plan.form != "attention":
        raise ValueError(f"plan.form={plan.form!r}: python_node runs the attention form")
    return AttentionForm.apply(q, k, v, log_g, float(scale), plan.p, plan.norm)


def states_in_place() -> bool:
    """Whether this backward may write over the saved states (1.8 GB less at 64k): only in a graph task that frees the
    graph after it (torch's retain_graph=False; unknown -> no), since another backward needs S."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keep is not None and not keep()


class ChunkedForm(torch.autograd.Function):
    """(y, s_final, z_final) of power attention, chunked form. q (b,T,hq,d), k/v (b,T,hk,d) with T % C == 0
    (the caller pads with zeros), gl (b,T,hk) fp32 chunk-local cumulative log-gates or None, s0 (b,hk,D_s,d)
    / z0 (b,hk,D_s) fp32 or None; family: the plan's state kernels ("p2" or "generic"). Under torch.compile a
    stateless call runs as the custom ops above instead."""

    @staticmethod
    def forward(ctx, q, k, v, gl, s0, z0, scale, p, norm, C, want_state, family):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        y, S, Z, lse, G = chunked_forward(q, k, v, gl, s0, z0, scale, p, norm, C, family)
        ctx.save_for_backward(q, k, v, G, S, Z, y, lse)
        ctx.cfg = (scale, p, norm, gl is not None, C, s0 is not None, family)
        # unused gradients arrive as None, not materialized zeros (the final state's: (b, hk, D_s, d) fp32)
        ctx.set_materialize_grads(False)
        if not want_state:      # a stateless call: no fp32 copy of the final state
            return y, None, None
        NC = q.shape[1] // C
        return y, S[:, :, NC].to(torch.float32, copy=True), Z[:, :, NC].clone()

    @staticmethod
    def backward(ctx, dy, dsf, dzf):
        saved = ctx.saved_tensors        # q, k, v, G, S, Z, y, lse
        if dy is None:                   # only the final state was used
            dy = torch.zeros_like(saved[-2])
        grads = chunked_backward(dy, dsf, dzf, *saved, *ctx.cfg, states_in_place=states_in_place())
        return (*grads, None, None, None, None, None, None)


def chunked_form(q, k, v, log_g, *, p, scale, chunk_size=None, norm, initial_state=None, return_state=False,
                 plan: Optional[Plan] = None):
    """Triton chunked form: any t (zero-padded to a multiple of the chunk), GQA, optional incoming state
    (PowerState or (s, z)), optionally returns the final PowerState (float32). Same semantics as
    reference.power_attention_reference with the same chunk_size. plan: the call's (power_attention makes it; its
    chunk and family run); None: the chunked form's plan for these inputs and chunk_size."""
    b, t, hq, d = q.shape
    if plan is None:
        plan = make_plan(t, p, d, q.dtype, q.device.type, chunk_size=chunk_size, norm=norm,
                         state_in=initial_state is not None, state_out=return_state, form="chunked")
    C = plan.chunk
    NC = -(-t // C)
    pad = NC * C - t
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    lg = log_g
    if log_g is not None and pad:
        lg = torch.nn.functional.pad(log_g, (0, 0, 0, pad))
    if plan.launcher == "custom_op":     # dynamo cannot trace the launches: one opaque op per pass
        y = chunked_form_op(q, k, v, lg, float(scale), int(p), bool(norm), C, plan.family)
        return y[:, :t] if pad else y
    gl = None if lg is None else gates.gate_cumsum(lg, C)                            # chunk-local G
    s0 = z0 = None
    if initial_state is not None:
        s0, z0 = (x.float() for x in initial_state)
    # the p=2 backward over the symmetric completion (chunk_p2 gluon_rows._sym_pass) reads the states' diagonal
    # blocks as symmetric, as every state the keys write is: where gradients flow, an incoming state's antisymmetric
    # part (no output but the returned state sees it) and the returned state's gradient's go around the kernels,
    # exactly, decayed by the whole sequence's gates
    around = plan.family == "p2" and (s0 is not None or return_state) and native.needs_grad(q, k, v, log_g, s0, z0)
    asym = None
    if around and s0 is not None:
        sym = symmetrize_diagonal_blocks(s0, d)
        s0, asym = sym, s0 - sym
    y, s, z = ChunkedForm.apply(q, k, v, gl, s0, z0, float(scale), int(p), bool(norm), C, bool(return_state),
                                plan.family)
    if around and return_state:
        s = symmetrize_diagonal_blocks(s, d)
        if asym is not None:
            s = s + (asym if log_g is None else torch.exp(log_g.float().sum(1))[..., None, None] * asym)
    y = y[:, :t] if pad else y
    return (y, PowerState(s, z)) if return_state else y
