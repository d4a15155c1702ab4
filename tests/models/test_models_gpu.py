"""GPU checks (run on the device: `pytest -m gpu tests/models`): our RWKV7 against FLA's RWKV7ForCausalLM on the
same weights, GPT-2 exp against a plain softmax reference, and the CPU path against the GPU path for every
arch x attention pair (same weights, same inputs), and the loss head against float64."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F

from _checks import perturb_
from longctx.models import ModelSpec, build_model
from longctx.models.common import nll_sum, per_token_nll
from longctx.models.rwkv7 import to_fla
from longctx.models import ATTENTIONS
from longctx.models.spec import ARCHS
from longctx.train.trainer import compile_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCAB = 97


def rel(a, b):
    """Norm-wise relative error ||a - b|| / ||b||, in fp64."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def gpu_spec(**kw):  # head_dim 32: the smallest the CUDA power kernel takes
    base = dict(vocab_size=VOCAB, d_model=128, n_layers=2, n_heads=4, ctx=512, window=64, chunk_size=None)
    base.update(kw)
    return ModelSpec.from_dict(base)  # flat attention parameters go to the attention that declares them


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_rwkv7_native_matches_fla(dtype, tol):
    torch.manual_seed(0)
    pytest.importorskip("fla.models")
    spec = gpu_spec(arch="rwkv7", attention="linear", d_model=256, n_heads=4, n_layers=3)  # head_dim 64
    ours = perturb_(build_model(spec), 0.02).cuda().eval()
    theirs = to_fla(ours).eval()
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = torch.randint(0, VOCAB, (2, 300), device="cuda")
    with torch.no_grad():
        a = ours(x)
        b = theirs(input_ids=x).logits
    assert rel(a, b) <= tol, rel(a, b)


def test_gpt2_exp_matches_plain_softmax_on_gpu():
    torch.manual_seed(0)
    model = perturb_(build_model(gpu_spec(arch="gpt2", attention="exp")), 0.02).cuda().eval()
    x = torch.randint(0, VOCAB, (2, 200), device="cuda")
    ref_model = copy.deepcopy(model)

    class Softmax(torch.nn.Module):
        def forward(self, q, k, v, x=None):
            t, d = q.shape[1], q.shape[-1]
            s = torch.einsum("bihd,bjhd->bhij", q.float(), k.float()) / math.sqrt(d)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v.float()).to(q.dtype)

    for block in ref_model.blocks:
        block.attn.core = Softmax()
    with torch.no_grad():
        assert rel(model(x), ref_model(x)) < 1e-5
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert rel(model(x).float(), ref_model(x).float()) < 2e-2


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_softmax_sink_and_partial_rotary_on_gpu_match_float64(dtype, tol):
    """The fused path (SDPA with the sink in padded head dims; flash-attn when installed), forward and input
    gradients, against the float64 definition on the CPU."""
    from test_softmax_options import sink_core, softmax_with_sink_reference
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 300, 4, 64, dtype=torch.float64, requires_grad=True) for _ in range(3))
    logit = torch.tensor([-2.0, 0.0, 1.0, 3.0], dtype=torch.float64)
    ref = softmax_with_sink_reference(q, k, v, logit)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    core = sink_core(h=4, d=64, logit=logit).float().cuda()
    qc, kc, vc = (z.detach().to("cuda", dtype).requires_grad_() for z in (q, k, v))
    y = core(qc, kc, vc)
    grads = torch.autograd.grad(y.float().square().sum(), (qc, kc, vc))
    assert rel(y.cpu(), ref) < tol
    for g, r in zip(grads, ref_grads):
        assert rel(g.cpu(), r) < 4 * tol
    model = build_model(gpu_spec(arch="gpt2", attention="exp", rope_dims=16))
    x = torch.randint(0, VOCAB, (2, 200))
    with torch.no_grad():
        assert rel(model.cuda()(x.cuda()).cpu(), model.cpu()(x)) < 1e-4


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
@pytest.mark.parametrize("arch", ARCHS)
def test_cpu_path_equals_gpu_path(arch, attention):
    """Same weights, same inputs: per-token NLL and gradients of the CPU references vs the CUDA kernels (fp32)."""
    torch.manual_seed(0)
    spec = gpu_spec(arch=arch, attention=attention)
    cpu = perturb_(build_model(spec), 0.02)
    gpu = copy.deepcopy(cpu).cuda()
    x = torch.randint(0, VOCAB, (2, 160))  # > window: the windowed paths (blocked on CPU, Flex on GPU) run
    y = torch.roll(x, -1, 1)
    nll_c = cpu(x, y)
    nll_g = gpu(x.cuda(), y.cuda())
    nll_c.mean().backward()
    nll_g.mean().backward()
    tol = 1e-4 if attention in ("exp", "window") else 2e-3  # Triton kernels may use TF32 inside
    assert rel(nll_g.cpu(), nll_c) < tol, rel(nll_g.cpu(), nll_c)
    for (name, pc), pg in zip(cpu.named_parameters(), gpu.parameters()):
        if pc.grad.abs().max() > 0:
            assert rel(pg.grad.cpu(), pc.grad) < 20 * tol, (name, rel(pg.grad.cpu(), pc.grad))


def test_gpt2_token_shift_on_gpu_matches_cpu():
    """The token shift through FLA's Triton op on the GPU: NLL and every gradient (the mix included) as on the CPU."""
    torch.manual_seed(0)
    cpu = perturb_(build_model(gpu_spec(arch="gpt2", attention="exp", token_shift=True)), 0.1)
    gpu = copy.deepcopy(cpu).cuda()
    x = torch.randint(0, VOCAB, (2, 160))
    y = torch.roll(x, -1, 1)
    nll_c, nll_g = cpu(x, y), gpu(x.cuda(), y.cuda())
    nll_c.mean().backward()
    nll_g.mean().backward()
    assert rel(nll_g.cpu(), nll_c) < 1e-4
    for (name, pc), pg in zip(cpu.named_parameters(), gpu.parameters()):
        assert rel(pg.grad.cpu(), pc.grad) < 2e-3, name


@pytest.mark.parametrize("arch", ARCHS)
def test_power_p2_bf16_long_context_finite(arch):
    torch.manual_seed(0)
    model = build_model(gpu_spec(arch=arch, attention="power", p=2, ctx=8192)).cuda()
    x = torch.randint(0, VOCAB, (1, 8192), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, x).mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_loss_head_on_gpu_matches_float64(dtype, tol):
    """The CUDA loss head (FLA's fused cross-entropy, chunked) against float64 torch at GPT-2's vocabulary size:
    per-token losses and both gradients (recomputed in the backward), and the summed loss the trainer uses and its
    gradients (formed in the forward)."""
    torch.manual_seed(0)
    vocab, n, d = 50304, 3000, 64
    h = (torch.randn(1, n, d, device="cuda") * 2).to(dtype).requires_grad_()
    w = (torch.randn(vocab, d, device="cuda") / d ** 0.5).to(dtype).requires_grad_()
    t = torch.randint(0, vocab, (1, n), device="cuda")
    g = torch.randn(1, n, device="cuda")
    hd, wd = (x.detach().double().requires_grad_() for x in (h, w))
    ref = F.cross_entropy((hd[0] @ wd.T), t[0], reduction="none")[None]
    dh_ref, dw_ref = torch.autograd.grad((ref * g).sum(), (hd, wd), retain_graph=True)
    out = per_token_nll(h, w, t, chunk_tokens=1024)
    dh, dw = torch.autograd.grad((out * g).sum(), (h, w))
    assert out.dtype == torch.float32
    assert rel(out, ref) < tol and rel(dh, dh_ref) < tol and rel(dw, dw_ref) < tol, \
        (rel(out, ref), rel(dh, dh_ref), rel(dw, dw_ref))
    # the trainer's summed loss: gradients formed in the forward, scaled in the backward
    dh_ref, dw_ref = torch.autograd.grad(0.37 * ref.sum(), (hd, wd))
    total = nll_sum(h, w, t, chunk_tokens=1024)
    dh, dw = torch.autograd.grad(0.37 * total, (h, w))
    assert rel(total, ref.sum()) < tol and rel(dh, dh_ref) < tol and rel(dw, dw_ref) < tol, \
        (rel(total, ref.sum()), rel(dh, dh_ref), rel(dw, dw_ref))


@pytest.mark.parametrize("chunk_size", [None, 64], ids=["attention_form", "chunked_form"])
@pytest.mark.parametrize("arch", ARCHS)
def test_compiled_power_model_matches_eager(arch, chunk_size):
    """torch.compile runs the power kernels as custom ops (kernels/power/autograd.py): with the blocks compiled
    (trainer.compile=blocks) the same per-token losses and gradients as eager, and no graph break inside the
    attention when the whole model is traced (FLA's fused loss head and token shift carry `torch.compiler.disable`
    and break the graph; removing those breaks measured no faster)."""
    torch.manual_seed(0)
    spec = gpu_spec(arch=arch, attention="power", p=2, chunk_size=chunk_size)
    eager = perturb_(build_model(spec), 0.02).cuda()
    compiled_model = copy.deepcopy(eager)
    x = torch.randint(0, VOCAB, (2, 256), device="cuda")
    y = torch.roll(x, -1, 1)
    nll_e = eager(x, y)
    nll_e.mean().backward()
    torch._dynamo.reset()
    nll_c = compile_model(compiled_model, "blocks")(x, y)
    nll_c.mean().backward()
    assert rel(nll_c, nll_e) < 1e-4, rel(nll_c, nll_e)
    for (name, pe), pc in zip(eager.named_parameters(), compiled_model.parameters()):
        if pe.grad.abs().max() > 0:
            assert rel(pc.grad, pe.grad) < 1e-3, (name, rel(pc.grad, pe.grad))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(eager)(x, y)  # the whole model traced (its blocks compiled above are a copy)
    in_attention = [str(r.reason)[:200] for r in explained.break_reasons
                    if any("kernels/power" in frame.filename for frame in r.user_stack)]
    assert explained.graph_count >= 1 and not in_attention, in_attention


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_matches_full_forward_on_gpu(arch, attention):
    """The CUDA decoding paths (power_attention_step's kernels, FLA's chunk_rwkv7 with states, the KV and rolling
    caches) against one full forward, fp32: a 100-token prompt (> the window of 64), then 40 single tokens."""
    torch.manual_seed(0)
    model = perturb_(build_model(gpu_spec(arch=arch, attention=attention)), 0.02).cuda().eval()
    x = torch.randint(0, VOCAB, (2, 140), device="cuda")
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model(x[:, :100], cache=cache)] + [model(x[:, i:i + 1], cache=cache) for i in range(100, 140)]
    tol = 1e-4 if attention in ("exp", "window") else 2e-3  # Triton kernels may use TF32 inside
    assert rel(torch.cat(parts, 1), full) < tol, rel(torch.cat(parts, 1), full)
    greedy = model.generate(x[:, :20], 30, temperature=0)
    assert torch.equal(greedy, model.generate(x[:, :20], 30, temperature=0, use_cache=False))
