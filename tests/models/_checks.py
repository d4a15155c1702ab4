"""Checks shared by the architecture tests."""
import torch


def assert_causal(model, vocab: int, min_change: float, t: int = 23, at: int = 13) -> None:
    """Changing the token at position `at` leaves every earlier output exactly as it was and moves a later one."""
    x = torch.randint(0, vocab, (1, t))
    y = x.clone()
    y[0, at] = (x[0, at] + 1) % vocab
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :at], b[:, :at], rtol=0, atol=1e-6)
    assert (a[:, at:] - b[:, at:]).abs().max() > min_change
