"""CPU: when the chunked backward may write its state gradients over the forward's saved states
(autograd.states_in_place): only in a backward that frees the graph after it, never under retain_graph=True
(a second backward would read the overwritten states)."""
import torch

from longctx.kernels.power import autograd


class _Probe(torch.autograd.Function):
    """Identity whose backward records states_in_place() as the chunked form's backward would see it."""
    seen: list = []

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _Probe.seen.append(autograd.states_in_place())
        return g


def _backward_sees(**kw) -> bool:
    x = torch.randn(3, requires_grad=True)
    y = _Probe.apply(x).sum()
    _Probe.seen.clear()
    torch.autograd.grad(y, x, **kw)
    return _Probe.seen[-1]


def test_in_place_only_when_the_graph_is_freed():
    assert _backward_sees() is True
    assert _backward_sees(retain_graph=True) is False

