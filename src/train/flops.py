"""FLOP accounting: weight vs state FLOPs (the paper's WSFR), training FLOPs, MFU against the card's peak.

Forward FLOPs per token come from the model (`model.flops_per_token(ctx)`, a multiply-add counted as 2);
a training step costs 3x the forward (forward + backward's two matmuls per forward matmul).

Two state counts are kept apart:
* `state_flops_per_token`: the architecture's own count, the recurrent form's (the paper's WSFR; docs/models.md);
* `executed_state_flops_per_token`: the form that actually runs, which every per-FLOP figure is charged with.
  Each state core charges it itself (`core.forward_flops(ctx, device_type, dtype)`), since only the core knows
  which kernel it calls: power attention the attention form (quadratic, like softmax attention) or the chunked form
  the kernels pick for that length and dtype, linear attention FLA's chunked form where FLA's kernel runs,
  softmax, window and RWKV7 what their own count says.
"""
from __future__ import annotations

import math

import torch

from longctx.models.common import state_cores

# Dense bf16 tensor-core peaks (vendor datasheets, without sparsity), TFLOP/s. Matched by substring of the
# device name, longest first; an unknown card gets no MFU rather than a wrong one.
PEAK_BF16_TFLOPS = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
    "GH200": 989.0, "B200": 2250.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "A10G": 125.0,
    "RTX 4090": 165.0, "RTX 3090": 71.0, "V100": 125.0, "MI300X": 1307.0,
}
TRAIN_FLOPS_FACTOR = 3.0


def peak_bf16_flops(device_name: str) -> float | None:
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_TFLOPS[key] * 1e12
    return None


def executed_state_flops(core, ctx: int, device_type: str = "cuda", dtype=torch.bfloat16) -> float:
    """Forward state FLOPs per token, one layer, of the form that runs (module docstring)."""
    return float(core.forward_flops(ctx, device_type, dtype))


def flops_report(model, ctx: int, device_type: str = "cuda", dtype=torch.bfloat16) -> dict:
    """Per-token forward FLOPs split into weight and state, their ratio (WSFR, the architecture's own count),
    the state size, and the training FLOPs per token charged with the form that runs on `device_type`/`dtype`."""
    f = model.flops_per_token(ctx)
    weight, state = float(f["weight"]), float(f["state"])
    executed = sum(executed_state_flops(core, ctx, device_type, dtype) for core in state_cores(model))
    return {
        "weight_flops_per_token": weight,
        "state_flops_per_token": state,
        "executed_state_flops_per_token": executed,
        "wsfr": weight / state if state > 0 else float("inf"),
        "train_flops_per_token": TRAIN_FLOPS_FACTOR * (weight + executed),
        "state_size": int(model.state_size(ctx)),
    }


def mfu(tokens_per_s: float, train_flops_per_token: float, device_name: str, n_devices: int = 1) -> float | None:
    peak = peak_bf16_flops(device_name)
    if peak is None:
        return None
    return tokens_per_s * train_flops_per_token / (peak * n_devices)


def budget_reached(tokens: float, train_flops_per_token: float, budget: float | None) -> bool:
    """Whether `tokens` trained tokens have spent a FLOP budget (trainer.flops_budget; None: no budget): the test
    the trainer stops on after each step."""
    return budget is not None and tokens * train_flops_per_token >= budget


def budget_steps(budget: float | None, tokens_per_step: int, train_flops_per_token: float) -> int | None:
    """The step at which a FLOP budget stops a run, the first whose tokens reach it (`budget_reached`); None without
    a budget. The trainer's schedule ends there and its start-of-run estimate counts the steps to it."""
    if budget is None:
        return None
    steps = max(1, math.ceil(budget / (tokens_per_step * train_flops_per_token)))
    while steps > 1 and budget_reached((steps - 1) * tokens_per_step, train_flops_per_token, budget):
        steps -= 1
    while not budget_reached(steps * tokens_per_step, train_flops_per_token, budget):
        steps += 1
    return steps


def format_ratio(wsfr: float) -> str:
    """WSFR as the paper writes it: 8:1 or 1:8."""
    if wsfr == float("inf"):
        return "inf:1"
    return f"{wsfr:.3g}:1" if wsfr >= 1 else f"1:{1 / wsfr:.3g}"
