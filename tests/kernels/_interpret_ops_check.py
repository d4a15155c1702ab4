"""Run by test_power_triton_interpret.py in a subprocess with TRITON_INTERPRET=1. The Triton forms as custom ops
(autograd.py's custom ops, the torch.compile path) against the autograd Functions (the eager path) on the same
kernels: eager op
calls and torch.compile(fullgraph=True) of the public form functions (no graph break allowed) give the same output
and gradients; torch.library.opcheck checks the ops' schemas, fake (shape) functions and autograd registration.
Prints one line per case and exits non-zero on a failure."""
import os

assert os.environ.get("TRITON_INTERPRET") == "1"
import torch  # noqa: E402

from longctx.kernels.power import autograd as ops  # noqa: E402
from longctx.kernels.power.chunk_p2 import config as p2_config  # noqa: E402
from longctx.kernels.power.dispatch import run  # noqa: E402
from longctx.kernels.power.interface import check_inputs  # noqa: E402
from longctx.kernels.power.plan import IMPL_ENV, make_plan  # noqa: E402
from longctx.kernels.power.autograd import attention_form  # noqa: E402
from longctx.kernels.power.autograd import chunked_form  # noqa: E402

CASES = [  # (form, p, norm, gated, hq, hk, d, t, chunk)
    ("attention", 2, True, True, 2, 1, 16, 150, None),
    ("attention", 1, False, False, 2, 2, 16, 70, None),
    ("chunked", 2, True, True, 4, 2, 16, 64, 16),       # GQA
    ("chunked", 2, True, True, 2, 1, 16, 45, 16),       # padded to 48
    ("chunked", 1, False, False, 2, 2, 16, 32, 16),     # ungated, not norm: the two dummies
    ("chunked_sym2", 2, True, True, 2, 1, 16, 48, 16),  # the p=2 kernels (forced for fp32)
    ("public", 2, True, True, 2, 1, 16, 48, None),      # power_attention's CUDA path: checks, routing, the op
    ("public_chunked", 2, True, True, 2, 1, 16, 48, None),   # the same with LONGCTX_POWER_IMPL=chunked
]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def call(form, p, norm, chunk):
    def f(q, k, v, lg):
        if form.startswith("public"):      # interface.power_attention's steps for a CUDA tensor
            _, t, _, _, d = check_inputs(q, k, v, lg, p, None, None, norm, None)
            plan = make_plan(t, p, d, q.dtype, "cuda", norm=norm)
            return run(plan, q, k, v, lg, scale=0.25, norm=norm, initial_state=None, return_state=False)
        if form == "attention":
            return attention_form(q, k, v, lg, p=p, scale=0.25, norm=norm)
        return chunked_form(q, k, v, lg, p=p, scale=0.25, chunk_size=chunk, norm=norm)
    return f


def outputs(f, leaves, seed):
    y = f(*leaves)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
    grads = torch.autograd.grad(y, [x for x in leaves if x is not None], g)
    return [y.detach(), *grads]


def main():
    torch.manual_seed(0)
    failed = 0
    for i, (form, p, norm, gated, hq, hk, d, t, chunk) in enumerate(CASES):
        with p2_config.override(force=form == "chunked_sym2"):
            os.environ[IMPL_ENV] = "chunked" if form == "public_chunked" else "auto"
            q = torch.randn(1, t, hq, d, requires_grad=True)
            k = torch.randn(1, t, hk, d, requires_grad=True)
            v = torch.randn(1, t, hk, d, requires_grad=True)
            lg = (-0.3 * torch.rand(1, t, hk)).requires_grad_() if gated else None
            leaves = [q, k, v, lg]
            f = call(form, p, norm, chunk)
            ref = outputs(f, leaves, i)
            op = None               # the op called eagerly (the public and padded cases are only compiled)
            if form == "attention":
                op = lambda q, k, v, lg: ops.attention_form_op(q, k, v, lg, 0.25, p, norm)  # noqa: E731
            elif form.startswith("chunked") and t % chunk == 0:
                family = make_plan(t, p, d, q.dtype, form="chunked").family
                op = lambda q, k, v, lg: ops.chunked_form_op(q, k, v, lg, 0.25, p, norm, chunk, family)  # noqa: E731
            errs = {}
            if op is not None:
                errs["op"] = max(rel(a, b) for a, b in zip(outputs(op, leaves, i), ref))
            torch._dynamo.reset()
            compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
            errs["compiled"] = max(rel(a, b) for a, b in zip(outputs(compiled, leaves, i), ref))
            torch._dynamo.reset()
            ex = torch._dynamo.explain(f)(*leaves)        # one graph, holding the form's op (not traced launches)
            op_name = "power_attention_form_fwd" if form in ("attention", "public") else "power_chunked_form_fwd"
            if ex.graph_break_count or not any(op_name in g.code for g in ex.graphs):
                errs["graph"] = float("inf")
            if form == "attention":
                torch.library.opcheck(ops._attention_fwd, (q, k, v, lg, 0.25, p, norm))
            elif chunk is not None and t % chunk == 0:
                family = make_plan(t, p, d, q.dtype, form="chunked").family
                torch.library.opcheck(ops._chunked_fwd, (q, k, v, lg, 0.25, p, norm, chunk, family))
        ok = max(errs.values()) <= 1e-6
        failed += not ok
        print(f"{form:12s} p={p} norm={norm} gated={gated} hq={hq} hk={hk} t={t} chunk={chunk} "
              + " ".join(f"{k_}={e:.1e}" for k_, e in errs.items()) + ("" if ok else "  FAIL"), flush=True)
    raise SystemExit(failed)


if __name__ == "__main__":
    main()
