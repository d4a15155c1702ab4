"""Float64 truth for the gate scan (longctx.kernels.power.gates): cumsum over time within segments of `seg` steps
(None: the whole sequence), differentiable, so its autograd gives the reverse scan's truth. Shared by the
interpreter check and the GPU test."""
import torch


def segment_cumsum_f64(x: torch.Tensor, seg=None) -> torch.Tensor:
    b, t, h = x.shape
    s = t if seg is None else seg
    n = -(-t // s)
    xp = torch.nn.functional.pad(x.double(), (0, 0, 0, n * s - t))
    return xp.view(b, n, s, h).cumsum(2).view(b, n * s, h)[:, :t]
