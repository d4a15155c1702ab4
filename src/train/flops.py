"""FLOP accounting: weight vs state FLOPs (the paper's WSFR), training FLOPs, MFU against the card's peak.

Forward FLOPs per token come from the model (`model.flops_per_token(ctx)`, a multiply-add counted as 2);
a training step costs 3x the forward (forward + backward's two matmuls per forward matmul).

Two state counts are kept apart:
* `state_flops_per_token`: the architecture's own count, the recurrent form's (the paper's WSFR; docs/models.md);
* `executed_state_flops_per_token`: the form that actually runs, which every per-FLOP figure is charged with.
  Power (and linear) attention runs on CUDA in the form the kernels' dispatch picks
  (longctx.kernels.power.dispatch.cuda_chunk_size): the attention form -- quadratic, like softmax attention --
  below the dispatch's threshold context and for p >= 3; above it the chunked form: attention inside each chunk
  of c tokens plus the state's query and update (the recurrent count). On CPU the reference runs the attention
  form. Softmax, window and RWKV7 cores run what their own count says.
"""
from __future__ import annotations

import torch

from longctx.kernels.power.dispatch import cuda_chunk_size
from longctx.models.attention.power import PowerAttention
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


def _causal_keys_per_query(t: int) -> float:
    """Mean number of keys a causal query reads over positions 0..t-1."""
    return (t + 1) / 2


def power_form(core: PowerAttention, ctx: int, device_type: str = "cuda", dtype=torch.bfloat16) -> int | None:
    """Chunk length of the form a power/linear core runs at `ctx` (None: the attention form)."""
    if core.chunk_size is not None:
        return core.chunk_size
    if device_type != "cuda":
        return None  # the CPU reference's stateless call is the attention form
    return cuda_chunk_size(ctx, core.p, core.head_dim, dtype)


def executed_state_flops(core, ctx: int, device_type: str = "cuda", dtype=torch.bfloat16) -> float:
    """Forward state FLOPs per token, one layer, of the form that runs (module docstring)."""
    if not isinstance(core, PowerAttention):
        return float(core.state_flops(ctx))
    per_head_attention = 2 * 2 * core.head_dim  # q.k and A.v: d multiply-adds per key each
    chunk = power_form(core, ctx, device_type, dtype)
    if chunk is None or chunk >= ctx:
        return float(core.n_heads * per_head_attention * _causal_keys_per_query(ctx))
    intra = core.n_heads * per_head_attention * _causal_keys_per_query(chunk)
    return float(intra + core.state_flops(ctx))


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


def format_ratio(wsfr: float) -> str:
    """WSFR as the paper writes it: 8:1 or 1:8."""
    if wsfr == float("inf"):
        return "inf:1"
    return f"{wsfr:.3g}:1" if wsfr >= 1 else f"1:{1 / wsfr:.3g}"
