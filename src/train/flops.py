"""FLOP accounting: weight vs state FLOPs (the paper's WSFR), training FLOPs, MFU against the card's peak.

Forward FLOPs per token come from the model (`model.flops_per_token(ctx)`, a multiply-add counted as 2);
a training step costs 3x the forward (forward + backward's two matmuls per forward matmul).
"""
from __future__ import annotations

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


def flops_report(model, ctx: int) -> dict:
    """Per-token forward FLOPs split into weight and state, their ratio, and the state size."""
    f = model.flops_per_token(ctx)
    weight, state = float(f["weight"]), float(f["state"])
    return {
        "weight_flops_per_token": weight,
        "state_flops_per_token": state,
        "wsfr": weight / state if state > 0 else float("inf"),
        "train_flops_per_token": TRAIN_FLOPS_FACTOR * (weight + state),
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
