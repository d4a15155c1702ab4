"""Context-parallel power attention on CPU (gloo): each rank's output slice and its slice's gradients of q, k, v,
log_g against one process's float64 computation of the whole sequence straight from the formula.

One spawned group per world size (2, 4) runs every case, so start-up is paid twice; the tests read its results.
Error measure: max |x - truth| / max |truth| per tensor. float64 runs with the reference's EPS guard at 0 (with it,
the normalized outputs differ at the 1e-6 level between where the states start: see the module docstring) and must
agree to 1e-10; float32 runs with the guard and may add 1e-5 to one process's own float32 error.
"""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from longctx.kernels.power import context_parallel_power_attention, power_attention
from longctx.kernels.power import reference
from tests.gloo_ranks import run_cases, spawn_ranks, write_rank

T = 36     # 18 / 9 tokens a rank: not a multiple of chunk 4
# name: (p, norm, gated, hq, hk, d, chunk_size, uneven slices)
CASES = {
    "p1-linear-gated-chunk4": (1, False, True, 4, 2, 8, 4, False),
    "p1-ungated-attnform": (1, False, False, 2, 2, 8, None, False),
    "p2-norm-gated-gqa-chunk4": (2, True, True, 4, 2, 8, 4, False),
    "p2-norm-gated-uneven": (2, True, True, 2, 1, 8, 4, True),
    "p2-ungated-attnform": (2, True, False, 4, 2, 8, None, False),
    "p2-nonorm-gated": (2, False, True, 2, 2, 8, 4, False),
    "p3-gated-gqa-chunk4": (3, False, True, 4, 2, 8, 4, False),
    "p3-ungated-attnform": (3, False, False, 2, 2, 8, None, False),
    "p4-norm-gated-gqa-chunk4": (4, True, True, 4, 2, 8, 4, False),
    "p4-norm-ungated-attnform": (4, True, False, 2, 1, 8, None, True),
}
TOL = {"float64": 1e-10, "float32": 1e-5}


def truth(q, k, v, log_g, p, norm):
    """Float64 quadratic form of the whole sequence, from the formula (no stabilizer, no EPS, no state)."""
    b, t, hq, d = q.shape
    rep = hq // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    s = d ** -0.5 * torch.einsum("bihd,bjhd->bhij", q, k)
    G = (torch.zeros(b, t, hq, dtype=q.dtype) if log_g is None
         else log_g.cumsum(1).repeat_interleave(rep, 2)).transpose(1, 2)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    A = s.pow(p) * (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    y = torch.einsum("bhij,bjhd->bihd", A, v)
    return y / A.sum(-1).transpose(1, 2)[..., None] if norm else y


def bounds(world, uneven):
    if uneven:
        return {2: [0, 7, T], 4: [0, 3, 17, 23, T]}[world]
    return [r * T // world for r in range(world + 1)]


def run_case(rank, world, case, dtype, group=None):
    p, norm, gated, hq, hk, d, chunk, uneven = case
    g = torch.Generator().manual_seed(p * 100 + hq)
    full = [torch.randn(2, T, h, d, generator=g, dtype=torch.float64) for h in (hq, hk, hk)]
    full.append(-0.3 * torch.rand(2, T, hk, generator=g, dtype=torch.float64) if gated else None)
    dy = torch.randn(2, T, hq, d, generator=g, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() if x is not None else None for x in full]
    yt = truth(*leaves, p, norm)
    (yt * dy).sum().backward()
    lo, hi = bounds(world, uneven)[rank:rank + 2]
    mine = [x[:, lo:hi].to(getattr(torch, dtype)).requires_grad_() if x is not None else None for x in full]
    y = context_parallel_power_attention(*mine, p=p, norm=norm, chunk_size=chunk, group=group)
    (y.double() * dy[:, lo:hi]).sum().backward()
    with torch.no_grad():                       # inference: no collective in a backward to line up
        y_ng = context_parallel_power_attention(*mine, p=p, norm=norm, chunk_size=chunk, group=group)
    errs = errors(y, mine, yt, leaves, gated, lo, hi)
    errs["y_no_grad"] = errors(y_ng, [], yt, [], False, lo, hi)["y"]
    base = dict.fromkeys(errs, 0.0)
    if dtype == "float32":      # one process's own float32 error on the whole sequence (EPS guard included)
        one = [x.float().requires_grad_() if x is not None else None for x in full]
        y1 = power_attention(*one, p=p, norm=norm, chunk_size=chunk)
        (y1.double() * dy).sum().backward()
        base = errors(y1, one, yt, leaves, gated, lo, hi)
        base["y_no_grad"] = base["y"]
    return {n: (e, base[n]) for n, e in errs.items()}


def errors(y, mine, yt, leaves, gated, lo, hi):
    """Relative max error per tensor of this rank's slice [lo, hi) (`mine`: the slice's leaves or the whole's)."""
    out = {}
    pairs = [("y", y, yt)] + [(n, m.grad, x.grad) for n, m, x in zip("qkv", mine, leaves)]
    if gated and mine:
        pairs.append(("log_g", mine[3].grad, leaves[3].grad))
    for name, a, t in pairs:
        t = t[:, lo:hi].detach()
        a = a if a.shape[1] == hi - lo else a[:, lo:hi]
        out[name] = ((a.double() - t).abs().max() / t.abs().max()).item()
    return out


def bad_inputs(rank):
    """Error messages of bad calls, on this rank (every rank must raise, none may hang)."""
    out = {}
    q = torch.randn(1, 5, 2, 8)
    kv = torch.randn(1, 5, 1 if rank == 1 else 2, 8)     # rank 1 disagrees on the k heads
    for name, args in {"heads": (q, kv, kv), "log_g": (q, q, q, torch.zeros(1, 4 if rank == 1 else 5, 2))}.items():
        try:
            context_parallel_power_attention(*args, p=2)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
    return out


def worker(rank, world, rdv, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    res = run_cases(lambda case, dtype: run_case(rank, world, case, dtype), CASES, TOL)
    if world == 4:  # two groups of 2 (a DP x CP layout's CP groups): gradients return within the group
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        eps, reference.EPS = reference.EPS, 0.0
        try:
            res["subgroup"] = run_case(rank % 2, 2, CASES["p2-norm-gated-gqa-chunk4"], "float64", groups[rank // 2])
        finally:
            reference.EPS = eps
    res["bad"] = bad_inputs(rank)
    write_rank(out, rank, res)
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def results(request, tmp_path_factory):
    world = request.param
    return spawn_ranks(worker, world, tmp_path_factory.mktemp(f"cp{world}"))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("case", list(CASES))
def test_matches_one_process(results, case, dtype):
    for rank, res in enumerate(results):
        errs = res[f"{case}-{dtype}"]
        # float32: the reference's EPS guard alone moves dq by up to ~3e-5 at p=4 in one process: the split may add
        # TOL to one process's own error, no more
        worst = {n: (e, b) for n, (e, b) in errs.items() if not e <= TOL[dtype] + b}     # NaN fails too
        assert not worst, f"rank {rank}: (error, one process's) {worst} (tolerance {TOL[dtype]} + one process's)"


def test_a_group_that_does_not_start_at_rank_0(results):
    if len(results) != 4:
        pytest.skip("the world of 4 holds two groups of 2")
    for rank, res in enumerate(results):
        worst = {n: e for n, (e, _) in res["subgroup"].items() if not e <= TOL["float64"]}
        assert not worst, f"rank {rank} (group {rank // 2}): {worst}"


def test_bad_inputs_raise_on_every_rank(results):
    msgs = [res["bad"] for res in results]
    for rank, m in enumerate(msgs):
        assert m["heads"] is not None and "k heads" in m["heads"] and "\n" not in m["heads"], m
        assert m["log_g"] is not None and "\n" not in m["log_g"], m
    assert "log_g shape" in msgs[1]["log_g"]           # the rank with the bad slice names the argument
    assert "rank 1" in msgs[0]["log_g"]                # the others name that rank
