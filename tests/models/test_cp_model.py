"""Context parallelism inside a model, on CPU (gloo): a GPT-2 whose documents are split along time over 2 (and 4)
ranks gives each rank its slice of the per-token losses of one process, and its parameter gradients summed over
the ranks are one process's gradients, for every attention core.

One spawned group per world size runs every case (start-up paid once); the tests read its results. Each rank also
computes one process's truth itself (the whole documents, the same seed). Error measure: max |x - truth| / max
|truth| per tensor (losses, every parameter's gradient). float64 runs with the power reference's EPS guard at 0
(with it, normalized outputs differ at the 1e-6 level between where states start: kernels.power.context_parallel)
and must agree to 1e-8 (the gate's parameters, which run in fp32, 1e-5); float32 may add 5e-5 to one process's
own float32 error.
"""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from longctx.models import ModelSpec, build_model
from longctx.models.context_parallel import ContextParallel, ContextParallelModel, set_context_parallel
from tests.gloo_ranks import run_cases, spawn_ranks, write_rank

T = 36      # 18 / 9 tokens a rank: not a multiple of chunk 4
SHIFT, CKPT = {"token_shift": True}, {"checkpoint_activations": True}
# name: (attention, its params, other ModelSpec fields); windows 5 (a halo from one rank), 13 (from two ranks at
# world 4), 40 (> T); checkpointed: the exchange runs again in the backward's recomputation
CASES = {
    "exp": ("exp", {}, {}),
    "exp-sink-token-shift": ("exp", {"sink": True}, SHIFT),
    "window1": ("window", {"window": 1}, {}),    # no halo at all
    "window5": ("window", {"window": 5}, {}),
    "window13-checkpointed": ("window", {"window": 13}, CKPT),
    "window40": ("window", {"window": 40}, {}),
    "linear-gated-chunk4": ("linear", {"chunk_size": 4}, {}),
    "linear-ungated-attnform": ("linear", {"gating": False}, {}),
    "power-p1-gated-chunk4": ("power", {"p": 1, "chunk_size": 4}, {}),
    "power-p2-gated-chunk4-checkpointed": ("power", {"p": 2, "chunk_size": 4}, CKPT),
    "power-p2-attnform-outnorm": ("power", {"p": 2, "output_norm": True}, {}),
    "power-p3-gated-chunk4": ("power", {"p": 3, "chunk_size": 4}, {}),
    "power-p4-gated-chunk4-token-shift": ("power", {"p": 4, "chunk_size": 4}, SHIFT),
}
# float32: the power reference's EPS guard alone moves p=4's gradients by ~3e-5 (kernels.power.context_parallel)
# float64: the per-head gate runs in fp32 whatever the model's dtype (HeadGate), so the gradients that pass through it
# carry fp32 round-off: its own parameters' (GATE_TOL), and a little of every earlier layer's (1e-9 measured)
TOL = {"float64": 1e-8, "float32": 5e-5}
GATE_TOL = 1e-5


def rel(a, truth):
    return ((a.double() - truth).abs().max() / truth.abs().max()).item()


def run_case(cp, case, dtype):
    attention, params, fields = case
    spec = ModelSpec(attention=attention, attention_params=params, vocab_size=11, d_model=16, n_layers=2, n_heads=2,
                     ctx=T, **fields)
    g = torch.Generator().manual_seed(7)
    inputs, targets = (torch.randint(0, 11, (2, T), generator=g) for _ in range(2))
    weight = torch.rand(2, T, generator=g, dtype=torch.float64)     # per-token weights: no uniform gradient
    torch.manual_seed(0)
    model = build_model(spec).double()
    with torch.no_grad():   # gates that forget: a state carried across slices must decay right
        for name, p in model.named_parameters():
            if name.endswith("gate.bias"):
                p.fill_(0.5)
    truth_nll = model(inputs, targets)
    (truth_nll * weight).sum().backward()
    truth_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model = model.to(getattr(torch, dtype))
    model.zero_grad(set_to_none=True)
    base = {}
    if dtype == "float32":  # one process's own float32 error
        nll = model(inputs, targets)
        (nll.double() * weight).sum().backward()
        base = {"nll": rel(nll, truth_nll.detach())}
        base.update({n: rel(p.grad, truth_grads[n]) for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    lo, hi = cp.start(T // cp.world), cp.start(T // cp.world) + T // cp.world
    set_context_parallel(model, cp)
    nll = model(inputs[:, lo:hi], targets[:, lo:hi])
    (nll.double() * weight[:, lo:hi]).sum().backward()
    errs = {"nll": rel(nll, truth_nll.detach()[:, lo:hi])}
    for n, p in model.named_parameters():
        grad = p.grad.clone()
        dist.all_reduce(grad, group=cp.group)
        errs[n] = rel(grad, truth_grads[n])
    with torch.no_grad():   # evaluation: whole documents in, whole per-token losses out, on every rank
        errs["nll_whole_no_grad"] = rel(ContextParallelModel(model, cp)(inputs, targets), truth_nll.detach())
    base["nll_whole_no_grad"] = base.get("nll", 0.0)
    return {n: (e, base.get(n, 0.0)) for n, e in errs.items()}


def worker(rank, world, rdv, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    cp = ContextParallel(dist.new_group(list(range(world))), rank, world)
    res = run_cases(lambda case, dtype: run_case(cp, case, dtype), CASES, TOL)
    write_rank(out, rank, res)
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.slow)], ids=lambda w: f"world{w}")
def results(request, tmp_path_factory):
    world = request.param
    return spawn_ranks(worker, world, tmp_path_factory.mktemp(f"cp_model{world}"))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("case", list(CASES))
def test_matches_one_process(results, case, dtype):
    for rank, res in enumerate(results):
        errs = res[f"{case}-{dtype}"]
        tol = {n: max(TOL[dtype], GATE_TOL if ".gate." in n else 0.0) for n in errs}
        worst = {n: (e, b) for n, (e, b) in errs.items() if not e <= tol[n] + b}     # NaN fails too
        assert not worst, f"rank {rank}: (error, one process's) {worst} (tolerance {TOL[dtype]} + one process's)"


def test_refuses_what_has_no_split():
    cp = ContextParallel(group=None, rank=0, world=2)   # refused before any collective: no process group needed
    rwkv = build_model(ModelSpec(arch="rwkv7", attention="linear", vocab_size=11, d_model=16, n_layers=1,
                                 n_heads=2, ctx=8))
    with pytest.raises(ValueError, match=r"^trainer\.context_parallel=2: arch=rwkv7 ") as err:
        set_context_parallel(rwkv, cp)
    assert "\n" not in str(err.value)
    gpt = build_model(ModelSpec(vocab_size=11, d_model=16, n_layers=1, n_heads=2, ctx=8))
    set_context_parallel(gpt, cp)
    assert gpt.context_parallel is cp and gpt.blocks[0].attn.core.context_parallel is cp
    set_context_parallel(gpt, None)     # None: the one-process model again
    assert all(getattr(m, "context_parallel", None) is None for m in gpt.modules())
