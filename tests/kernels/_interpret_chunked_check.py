"""Run by test_power_triton_interpret.py in a subprocess with TRITON_INTERPRET=1: the Triton chunked-form
kernels (chunk.py, chunk_p2/kernels.py), forward and every gradient (q, k, v, log_g, initial state), plus the returned
state, against the float64 reference at tiny sizes. Prints one line per case; exits non-zero on a failure.
Error measure: relative Frobenius error. Usage: _interpret_chunked_check.py [case indices...] [sym2] [groups|rows],
or _interpret_chunked_check.py intra (the intra-chunk attention on chunks of whole tiles)
The cases run the generic state kernels (_update_state_fwd / _query_grad_state + _discumsum); the p=2 cases rerun
some through the p=2 kernels (chunk_p2 config force), grouped and row-scaled, with atomics and barriers."""
import contextlib
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
import torch  # noqa: E402

from longctx.kernels.power.reference import PowerState, power_attention_reference, state_dim  # noqa: E402
from longctx.kernels.power import config  # noqa: E402
from longctx.kernels.power.autograd import chunked_form  # noqa: E402
from longctx.kernels.power.chunk_p2 import config as p2_config  # noqa: E402
from longctx.kernels.power.chunk_p2 import kernels as p2_kernels  # noqa: E402
from longctx.kernels.power.chunk_p2 import stages as p2_stages  # noqa: E402

CASES = [  # (dtype, p, norm, gated, hq, hk, d, t, chunk, state_in, state_out, tol)
    (torch.float32, 2, True, True, 2, 1, 16, 45, 16, True, True, 1e-4),     # padding, state in and out
    (torch.float32, 2, True, True, 4, 2, 16, 80, 37, False, False, 1e-4),   # odd chunk, GQA
    (torch.float32, 1, False, False, 2, 2, 16, 40, 16, True, True, 1e-4),
    (torch.float32, 3, False, True, 2, 1, 16, 33, 16, False, True, 1e-4),
    (torch.float32, 4, True, 'strong', 1, 1, 16, 20, 8, True, False, 1e-4),
    (torch.float32, 2, False, True, 2, 1, 32, 40, 16, False, False, 1e-4),
    (torch.float16, 2, True, True, 2, 1, 16, 40, 16, False, False, 5e-3),
    (torch.float32, 2, True, True, 2, 1, 16, 1, 16, True, True, 1e-4),      # one decoding step
    (torch.float32, 2, True, True, 2, 1, 16, 200, 16, True, True, 1e-4),    # 13 chunks: longer discumsum
    (torch.float32, 2, True, True, 4, 2, 32, 50, 16, True, True, 1e-4),     # d=32: split windows (sym2 rows)
]
SYM2 = [0, 1, 5, 6, 7, 8, 9]   # p=2 cases also run through the p=2 kernels (forced for fp32; fp16: CAST) ...
SYM2_GROUPS = [0, 9]        # ... with the grouped kernels everywhere, and (default run) with the row-scaled ones,
#                             and with the backward's dq / dk updates by barrier + read-modify-write (not atomics)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run(case, fast=False, rows=None, atomic=True, plain=False):
    """rows: the query backward row-scaled (True) or grouped (False; None: the default for d). plain: the row-scaled
    loops without slice prefetch."""
    # the GQA case also splits the intra-chunk launches (as CUDA's grid-dim limit forces at 64k, small chunks)
    switches = dict(force=fast, atomic_rmw=atomic) | (dict(qfwd_pipe=0, kdv_pipe=0) if plain else {}) \
        | ({} if rows is None else dict(grouped_qbwd_min_d=1024 if rows else 0))
    with p2_config.override(**switches), config.chunk.override(max_grid_y=5 if case[4] == 4 else 65535):
        return _run(case, fast, rows, atomic, plain)


def _run(case, fast, rows, atomic, plain):
    dtype, p, norm, gated, hq, hk, d, t, chunk, state_in, state_out, tol = case
    q = torch.randn(1, t, hq, d, dtype=dtype, requires_grad=True)
    k = torch.randn(1, t, hk, d, dtype=dtype, requires_grad=True)
    v = torch.randn(1, t, hk, d, dtype=dtype, requires_grad=True)
    leaves = [q, k, v]
    lg = None
    if gated:
        lg = (-(3.0 if gated == "strong" else 0.3) * torch.rand(1, t, hk)).requires_grad_()
        leaves.append(lg)
    st = None
    if state_in:
        D = state_dim(p, d)
        # a plausible incoming state: the one left by 20 earlier tokens
        kk = torch.randn(1, 20, hk, d)
        _, st = power_attention_reference(torch.randn(1, 20, hq, d), kk, torch.randn(1, 20, hk, d), p=p,
                                          norm=norm, chunk_size=20, return_state=True)
        st = tuple(x.clone().requires_grad_() for x in st)
        assert st[0].shape[-2] == D
        leaves += list(st)
    out = chunked_form(q, k, v, lg, p=p, scale=d ** -0.5, chunk_size=chunk, norm=norm, initial_state=st,
                       return_state=state_out)
    outs = list(out) if state_out else [out]
    outs = [outs[0]] + (list(outs[1]) if state_out else [])
    seeds = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(outs, leaves, seeds)
    ref = [x.detach().double().requires_grad_() for x in leaves]
    rq, rk, rv = ref[:3]
    rlg = ref[3] if gated else None
    rst = PowerState(*ref[-2:]) if state_in else None
    rout = power_attention_reference(rq, rk, rv, rlg, p=p, norm=norm, chunk_size=chunk, initial_state=rst,
                                     return_state=state_out)
    routs = [rout[0]] + list(rout[1]) if state_out else [rout]
    grads_ref = torch.autograd.grad(routs, ref, [s.double() for s in seeds])
    errs = [rel(o, r) for o, r in zip(outs, routs)] + [rel(g, gr) for g, gr in zip(grads, grads_ref)]
    names = ["y", "s", "z"][:len(outs)] + ["dq", "dk", "dv"] + (["dlog_g"] if gated else []) \
        + (["ds0", "dz0"] if state_in else [])
    finite = all(torch.isfinite(x).all() for x in outs + list(grads))
    ok = finite and all(e < tol for e in errs)
    path = ("sym2" + {None: " dflt", True: " rows", False: " grp "}[rows]) if fast else "generic  "
    path += "" if atomic or not fast else " rmw"
    path += " plain" if plain else ""
    print(f"{'ok  ' if ok else 'FAIL'} {path} {dtype} p={p} norm={norm} "
          f"gated={gated} hq={hq} hk={hk} d={d} t={t} "
          f"chunk={chunk} state_in={state_in} state_out={state_out} tol={tol} "
          + " ".join(f"{n}={e:.1e}" for n, e in zip(names, errs)), flush=True)
    return ok


def scaled_copy_reference(x, G, lse, sqrt_scale_p, hk, chunk, keys, norm, gated):
    """What the Gluon outer products read (fp32, (b, h, d, t)): x (b, t, h, d) times the square root of its row
    factor, keys e^((gt_n - g_j) / 2) (gt_n: G at the chunk's last row), queries s^(p/2) e^((g_i - lse_i) / 2)."""
    b, t, h, d = x.shape
    Gh = (G if gated else torch.zeros(b, t, hk)).repeat_interleave(h // hk, dim=2)    # (b, t, h): each head's gates
    if keys:
        g_end = Gh.view(b, t // chunk, chunk, h)[:, :, -1:].expand(-1, -1, chunk, -1).reshape(b, t, h)
        f = torch.exp(0.5 * (g_end - Gh))
    else:
        f = sqrt_scale_p * torch.exp(0.5 * (Gh - (lse if norm else 0.0)))
    return (x.float() * f[..., None]).permute(0, 2, 3, 1)


def attention_copies(norm, gated):
    """The chunked form's attention kernels writing the Gluon outer products' scaled copies (keys from the forward,
    queries and their normalizer weights [hi, lo, 0, ...] of -Delta_i from dq). The CPU never runs gluon_outer, so
    the copies are checked where launch_outer receives them, against fp32 copies scaled on that call's own inputs
    (bf16-sized errors) and -Delta (hi + lo to bf16's 2^-16); GQA, bf16, the chunk-batch split over several launches
    (max_grid_y)."""
    b, t, hq, hk, d, chunk = 2, 64, 4, 2, 16, 16
    errs = {}
    launch_outer = p2_kernels.launch_outer

    def spy(X, Y, G, LSE, DELTA, OUT, OUTZ, scale_p, T, NC, DS, slot, hx, hk_, d_, C, keys, norm_, gated_, *rest,
            copy=None, **kw):
        want = scaled_copy_reference(X, G, LSE, scale_p ** 0.5, hk_, C, keys, norm_, gated_)
        name = "k" if keys else "q"
        errs[name] = rel(copy[0], want)
        if norm_ and not keys:
            w = copy[1]
            errs["w"] = rel(w[..., 0].double() + w[..., 1].double(), -DELTA)
            errs["w0"] = float(not bool((w[..., 2:] == 0).all()))
        return launch_outer(X, Y, G, LSE, DELTA, OUT, OUTZ, scale_p, T, NC, DS, slot, hx, hk_, d_, C, keys, norm_,
                            gated_, *rest, **kw)

    p2_kernels.launch_outer = spy
    copy_in_attention = p2_stages._copy_in_attention
    p2_stages._copy_in_attention = lambda x, d, C: True         # as on a GPU with gluon_outer
    try:
        stack = contextlib.ExitStack()
        stack.enter_context(p2_config.override(force=True))
        stack.enter_context(config.chunk.override(max_grid_y=3 * hq))
        q, k, v = (torch.randn(b, t, h, d, dtype=torch.bfloat16, requires_grad=True) for h in (hq, hk, hk))
        lg = (-0.3 * torch.rand(b, t, hk)).requires_grad_() if gated else None
        y = chunked_form(q, k, v, lg, p=2, scale=d ** -0.5, chunk_size=chunk, norm=norm)
        y.backward(torch.randn_like(y))
        stack.close()
    finally:
        p2_kernels.launch_outer = launch_outer
        p2_stages._copy_in_attention = copy_in_attention
    tol = {"k": 1e-2, "q": 1e-2, "w": 1e-4, "w0": 0.5}
    ok = set(errs) == ({"k", "q", "w", "w0"} if norm else {"k", "q"}) and all(e < tol[n] for n, e in errs.items())
    print(f"{'ok  ' if ok else 'FAIL'} copies in attention norm={norm} gated={gated} "
          + " ".join(f"{n}={e:.1e}" for n, e in errs.items()))
    return ok


def norm_scan(keys, gated, du_mult, rows=None, ahead=None):
    """chunk_p2.kernels.launch_norm_scan (the normalizer half of the Gluon outer products' scan, which the CPU never
    launches) against float64 sums of the tiled symmetric power: keys z_{n+1} = decay_n z_n + sum_r phi_w(x'_r)
    (phi with the key multiplicities), query side R_n = decay_n R_{n+1} + sum_r w_r phi(x'_r) in reverse, its gate
    gradient decay_n <z_n, R_{n+1}> and dU's multiplicities (du_mult). rows / ahead: config norm_sums_rows (64: a
    program a chunk; the default, all 3 chunks in one) and norm_scan_ahead (0: none loaded ahead, 1: the next chunk)
    if given."""
    from longctx.kernels.power.reference import expand
    b, hk, d, C, NC = 1, 2, 32, 64, 3
    hx, T, DS = (hk if keys else 2 * hk), C * NC, state_dim(2, d)
    xt = torch.randn(b, hx, d, T)
    w = torch.randn(b, T, hx, 8)
    g = -(0.02 * torch.rand(b, T, hk)).cumsum(1)
    outz = torch.full((b, hk, NC + 1, DS), float("nan"))
    outz[:, :, 0 if keys else NC] = torch.randn(b, hk, DS)
    entering = outz.clone()
    zf = torch.randn(b, hk, NC + 1, DS)
    switches = dict(norm_sums_bk=32)          # two steps a chunk
    switches |= {} if rows is None else dict(norm_sums_rows=rows)
    switches |= {} if ahead is None else dict(norm_scan_ahead=ahead)
    with p2_config.override(**switches):
        dgt = p2_kernels.launch_norm_scan(xt, w, g, outz, None if keys else zf, T, NC, DS, 1 if keys else 0, hx, hk,
                                          d, C, keys, True, gated, du_mult)
    x = xt.double().transpose(2, 3).reshape(b, hk, hx // hk, NC, C, d)           # (b, hk, rep, chunk, row, d)
    phi = expand(x, 2, weighted=keys)
    if not keys:
        phi = phi * (w[..., 0] + w[..., 1]).double().permute(0, 2, 1).reshape(b, hk, hx // hk, NC, C)[..., None]
    sums = phi.sum((2, 4))                                                         # (b, hk, NC, DS)
    ones = torch.ones(d, dtype=torch.float64)
    mult = expand(ones, 2, weighted=True) / expand(ones, 2)
    decay = g[:, C - 1::C].double().exp().permute(0, 2, 1) if gated else torch.ones(b, hk, NC, dtype=torch.float64)
    want = entering.double().clone()
    want_dgt = torch.zeros(b, hk, NC, dtype=torch.float64)
    if keys:
        for n in range(NC):
            want[:, :, n + 1] = decay[..., n, None] * want[:, :, n] + sums[:, :, n]
    else:
        r = want[:, :, NC].clone()
        if du_mult:
            want[:, :, NC] = r * mult
        for n in reversed(range(NC)):
            want_dgt[..., n] = decay[..., n] * (zf.double()[:, :, n] * r).sum(-1)
            r = decay[..., n, None] * r + sums[:, :, n]
            want[:, :, n] = r * mult if du_mult and n > 0 else r
    errs = {"z": rel(outz, want)}
    if gated and not keys:
        errs["dgt"] = rel(dgt, want_dgt)
    ok = all(e < 1e-5 for e in errs.values()) and (dgt is None) == (keys or not gated)
    print(f"{'ok  ' if ok else 'FAIL'} normalizer scan keys={keys} gated={gated} du_mult={du_mult} rows={rows} "
          f"ahead={ahead} "
          + " ".join(f"{n}={e:.1e}" for n, e in errs.items()))
    return ok


INTRA_TILES = {"fwd": (64, 32, 4, 1), "dq": (64, 64, 4, 1), "dkdv": (64, 64, 4, 1)}


def intra_whole_tiles():
    """Chunks of whole tiles (128 rows, the tiles above): the intra-chunk attention's launches take EVEN (no row or key
    masks; the CASES' chunks of 8 to 37 rows keep them), against the float64 reference with mild and strong gates,
    GQA."""
    from longctx.kernels.power import chunk_stages
    with config.attention.override(block_override=INTRA_TILES):
        even = {(kernel, C): chunk_stages.intra_tiles(16, kernel, torch.float32, True, C)["EVEN"]
                for kernel in ("fwd", "dq", "dkdv") for C in (128, 96)}
        ok = all(e == (C == 128) for (_, C), e in even.items())
        print(f"{'ok  ' if ok else 'FAIL'} EVEN on chunks of whole tiles only", flush=True)
        for gated in (True, "strong"):
            torch.manual_seed(0)
            ok &= run((torch.float32, 2, True, gated, 2, 1, 16, 256, 128, False, False, 1e-4))
    return ok


def main():
    torch.manual_seed(0)
    if sys.argv[1:] == ["intra"]:
        sys.exit(0 if intra_whole_tiles() else 1)
    args = [a for a in sys.argv[1:] if a not in ("sym2", "groups", "rows")]
    which = [int(a) for a in args] or range(len(CASES))
    rows = False if "groups" in sys.argv else (True if "rows" in sys.argv else None)
    failed = sum(not run(CASES[i], fast="sym2" in sys.argv, rows=rows) for i in which)
    if not sys.argv[1:]:
        failed += sum(not run(CASES[i], fast=True) for i in SYM2)
        failed += sum(not run(CASES[i], fast=True, rows=r) for i in SYM2_GROUPS for r in (False, True))
        failed += sum(not run(CASES[i], fast=True, atomic=False) for i in SYM2_GROUPS)   # barrier + RMW updates
        failed += sum(not run(CASES[i], fast=True, plain=True) for i in SYM2_GROUPS)
        failed += sum(not run(CASES[i], fast=True, rows=True, atomic=False) for i in SYM2_GROUPS)
        failed += sum(not attention_copies(norm, gated) for norm in (True, False) for gated in (True, False))
        failed += sum(not norm_scan(keys, gated, du_mult) for keys, gated, du_mult in
                      ((True, True, False), (True, False, False), (False, True, False), (False, False, False),
                       (False, True, True)))
        failed += sum(not norm_scan(keys, True, not keys, rows, ahead) for keys in (True, False)
                      for rows, ahead in ((64, 0), (64, 1)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
