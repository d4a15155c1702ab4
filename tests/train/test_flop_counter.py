"""longctx.train.flops against torch's own FLOP counter (torch.utils.flop_counter.FlopCounterMode).

What each counts: FlopCounterMode counts every matmul torch runs (2 FLOPs a multiply-add); the model's count is
per token, its weight part (every Linear and the LM head) and its state part (the attention: q.k and A.v, 2 * 2 *
head_dim per key) over the causal keys only, (t + 1) / 2 per query on average. SDPA's math backend (forced here, so
the counter sees its matmuls) multiplies the full t x t score matrix and masks it afterwards, so its attention count
is the causal one times 2t / (t + 1). The weight matmuls agree exactly; a training step (forward and backward,
the fused loss's in-forward gradients included) is exactly 3x the forward. Tolerance: 1e-9 relative (float sums).
"""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from longctx.models import build_model
from longctx.train.flops import TRAIN_FLOPS_FACTOR, flops_report
from longctx.train.trainer import model_spec, model_vocab_size

CTX, DOCS = 64, 2
ATTENTION_OPS = {"aten.bmm"}  # the math backend's q.k^T and A.v (the weights run as addmm/mm)


def counted(model, train: bool = False) -> dict[str, int]:
    x = torch.randint(0, model.spec.vocab_size, (DOCS, CTX))
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH), torch.set_grad_enabled(train):
        out = model(x, x, reduction="sum") if train else model(x)
        if train:
            out.backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("attention", ["exp", "power"])
def test_forward_matmul_flops_equal_the_models_count(compose, attention):
    cfg = compose("run_dir=unused", f"ctx={CTX}", f"attention={attention}")
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    report = flops_report(model, CTX, "cpu", torch.float32)  # on CPU both attentions run the attention form
    ops = counted(model)
    tokens = DOCS * CTX
    weight = sum(n for op, n in ops.items() if op not in ATTENTION_OPS)
    attention_flops = sum(n for op, n in ops.items() if op in ATTENTION_OPS)
    assert weight == pytest.approx(tokens * report["weight_flops_per_token"], rel=1e-9)
    full_over_causal = 2 * CTX / (CTX + 1)
    assert attention_flops == pytest.approx(tokens * report["executed_state_flops_per_token"] * full_over_causal,
                                            rel=1e-9)


def test_a_training_step_is_three_forwards(compose):
    cfg = compose("run_dir=unused", f"ctx={CTX}")
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    assert sum(counted(model, train=True).values()) == pytest.approx(
        TRAIN_FLOPS_FACTOR * sum(counted(model).values()), rel=1e-9)
