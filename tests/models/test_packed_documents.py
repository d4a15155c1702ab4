"""Packed documents (`doc_ids`): a packed row's per-document outputs, losses and gradients equal those of the
documents run one by one, in float64 on CPU, for every attention on GPT-2 and RWKV-7; and no token reads across a
boundary (perturbing one document leaves the others' outputs unchanged)."""
import dataclasses

import pytest
import torch

from longctx.models import ATTENTIONS, build_model
from longctx.models.common import doc_positions, doc_starts
from tests.models._checks import VOCAB, tiny_spec

# two rows of 23 tokens: documents of odd lengths, one of a single token, one longer than the window (5) and the
# power chunk (8), so the blocked window and the chunked state scan both cross boundaries
LENGTHS = [[7, 1, 9, 6], [23]]
ROW_LEN = 23

# RWKV-7 with an attention core runs the cores' same document paths as GPT-2: the slow suite has those cases
CASES = [pytest.param(arch, attention, {}, id=f"{arch}-{attention}",
                      marks=[pytest.mark.slow] if arch == "rwkv7" and attention != "linear" else [])
         for arch in ("gpt2", "rwkv7") for attention in sorted(ATTENTIONS)]
CASES += [pytest.param("gpt2", "power", dict(p=1), id="gpt2-power-p1", marks=pytest.mark.slow),  # linear's p=1 path
          pytest.param("gpt2", "power", dict(p=3), id="gpt2-power-p3")]
CASES += [pytest.param("gpt2", "power", dict(gating=False), id="gpt2-power-ungated"),
          pytest.param("gpt2", "power", dict(chunk_size=None), id="gpt2-power-attention-form"),
          pytest.param("gpt2", "exp", dict(sink=True), id="gpt2-exp-sink"),
          pytest.param("gpt2", "power", dict(token_shift=True), id="gpt2-power-token-shift"),
          pytest.param("gpt2", "exp", dict(positions="learned"), id="gpt2-exp-learned-positions")]


def _doc_ids(lengths) -> torch.Tensor:
    return torch.stack([torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row)) for row in lengths])


def _model(arch, attention, kw):
    torch.manual_seed(0)
    model = build_model(tiny_spec(arch, attention=attention, **kw)).double()
    with torch.no_grad():  # RWKV-7 starts with zero output projections: random weights make every path matter
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _separate(model, ids, targets, lengths):
    """Per-token losses and summed-loss gradients of each document run on its own, laid out as the packed rows."""
    model.zero_grad()
    losses = torch.empty(ids.shape, dtype=torch.float64)
    for r, row in enumerate(lengths):
        lo = 0
        for n in row:
            loss = model(ids[r:r + 1, lo:lo + n], targets[r:r + 1, lo:lo + n])  # (1, n)
            loss.sum().backward()
            losses[r, lo:lo + n] = loss[0].detach()
            lo += n
    return losses, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch, attention, kw", CASES)
def test_packed_row_equals_documents_run_alone(arch, attention, kw):
    model = _model(arch, attention, kw)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (len(LENGTHS), ROW_LEN), generator=g)
    targets = torch.randint(0, VOCAB, ids.shape, generator=g)
    doc_ids = _doc_ids(LENGTHS)
    want, want_grads = _separate(model, ids, targets, LENGTHS)

    model.zero_grad()
    got = model(ids, targets, doc_ids=doc_ids)                                    # (b, t) per-token NLL
    got.sum().backward()
    err = (got.detach() - want).abs().max().item()
    assert err < 1e-9, f"per-token loss: max abs error {err:.3g} against the documents run alone"
    for name, p in model.named_parameters():
        if name in want_grads:
            scale = want_grads[name].abs().max().item() + 1e-12
            gerr = (p.grad - want_grads[name]).abs().max().item() / scale
            tol = 1e-5 if ".gate." in name else 1e-8  # HeadGate computes in fp32 whatever the model's dtype
            assert gerr < tol, f"gradient of {name}: max relative error {gerr:.3g}"
        else:  # a parameter no document's loss reaches reaches no packed loss either
            assert p.grad is None or not p.grad.any(), name


@pytest.mark.parametrize("arch, attention, kw", [c for c in CASES if not c.values[2]])
def test_no_token_reads_across_a_boundary(arch, attention, kw):
    """Change every token of one document: the logits of the others stay the same, its own change."""
    model = _model(arch, attention, kw)
    ids = torch.randint(0, VOCAB, (1, ROW_LEN), generator=torch.Generator().manual_seed(2))
    doc_ids = _doc_ids(LENGTHS[:1])
    with torch.no_grad():
        before = model(ids, doc_ids=doc_ids)
        changed = ids.clone()
        a = doc_ids == 2                                                          # the third document
        changed[a] = (changed[a] + 1) % VOCAB
        after = model(changed, doc_ids=doc_ids)
    diff = (after - before).abs().amax(-1)[0]                                     # (t,)
    assert diff[~a[0]].max().item() < 1e-12, f"other documents moved by {diff[~a[0]].max().item():.3g}"
    assert diff[a[0]].min().item() > 1e-6, "the changed document's own logits did not change"


def test_one_document_a_row_is_the_unpacked_model():
    """doc_ids naming one document per row gives what the model gives without doc_ids."""
    for arch, attention in [("gpt2", "window"), ("gpt2", "power"), ("rwkv7", "linear")]:
        model = _model(arch, attention, {})
        ids = torch.randint(0, VOCAB, (2, ROW_LEN), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            plain = model(ids)
            packed = model(ids, doc_ids=torch.zeros_like(ids))
        assert (plain - packed).abs().max().item() < 1e-10, (arch, attention)


def test_positions_and_starts():
    doc_ids = torch.tensor([[0, 0, 0, 1, 2, 2], [5, 5, 5, 5, 5, 5]])
    assert doc_positions(doc_ids).tolist() == [[0, 1, 2, 0, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert doc_starts(doc_ids).tolist() == [[True, False, False, True, True, False], [True] + [False] * 5]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window, sink", [pytest.param(None, False, id="exp", marks=pytest.mark.slow),
                                          pytest.param(5, False, id="window"),
                                          pytest.param(None, True, id="sink", marks=pytest.mark.slow)])
def test_flex_document_mask_matches_the_sdpa_mask(monkeypatch, window, sink):
    """The CUDA path's FlexAttention document mask (run eagerly on CPU here: the compiled kernel needs a GPU) gives
    the CPU path's attention."""
    from torch.nn.attention.flex_attention import flex_attention

    from longctx.models.attention import shared
    monkeypatch.setattr(shared, "_flex_documents_compiled", flex_attention)
    g = torch.Generator().manual_seed(4)
    doc_ids = _doc_ids([[7, 1, 9, 6, 14], [37]])
    t = doc_ids.shape[1] + int(sink)                                             # the sink sits in front
    q, k, v = (torch.randn(2, t, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    want = shared.document_attention(q, k, v, doc_ids, window=window, sink=sink)
    seg = shared.doc_segments(doc_ids)
    seg = torch.nn.functional.pad(seg + 1, (1, 0)) if sink else seg
    got = shared._flex_documents(*(z.transpose(1, 2) for z in (q, k, v)), seg, None, window, sink).transpose(1, 2)
    assert (got - want).abs().max().item() < 1e-12


@pytest.mark.gpu
@pytest.mark.parametrize("arch, attention", [(a, n) for a in ("gpt2", "rwkv7") for n in sorted(ATTENTIONS)])
def test_packed_row_equals_documents_run_alone_cuda(arch, attention):
    """The CUDA paths (FlexAttention document masks, the power kernels' boundary gates, FLA's cu_seqlens) under bf16
    autocast: per-token losses of a packed row against each document run alone, within bf16's noise."""
    torch.manual_seed(0)
    declared = {f.name for f in dataclasses.fields(ATTENTIONS[attention].Params)}
    kw = {"chunk_size": None} if "chunk_size" in declared else {}  # the kernels' own choice
    model = build_model(tiny_spec(arch, attention=attention, d_model=128, n_heads=2, **kw)).cuda()  # head_dim 64
    lengths = [[100, 1, 250, 161], [512]]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 512), generator=g).cuda()
    targets = torch.randint(0, VOCAB, ids.shape, generator=g).cuda()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got = model(ids, targets, doc_ids=_doc_ids(lengths).cuda())
        for r, row in enumerate(lengths):
            lo = 0
            for n in row:
                want = model(ids[r:r + 1, lo:lo + n], targets[r:r + 1, lo:lo + n])[0]
                err = (got[r, lo:lo + n] - want).abs().max().item()
                assert err < 0.05, f"row {r}, document at {lo} ({n} tokens): max abs loss error {err:.3g}"
                lo += n
