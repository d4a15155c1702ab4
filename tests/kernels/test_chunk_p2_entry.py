"""The p=2 family's one decision and one entry per direction (no GPU): chunk_p2.applies decides where it runs (config
enabled / force, bf16, p = 2, head dims of whole tiles), and dispatch's chunk length, autograd's state dtype and
chunk.py's routing all follow it; chunk.py reaches the family only through applies / forward / backward."""
import ast
from pathlib import Path

import pytest
import torch

from longctx.kernels.power import chunk, chunk_p2, config, dispatch
from longctx.kernels.power.chunk_p2 import config as p2_config

CHUNK_PY = Path(chunk.__file__)


@pytest.mark.parametrize("p, d, dtype, switches, want", [
    (2, 64, torch.bfloat16, {}, True),
    (2, 32, torch.bfloat16, {}, True),
    (2, 128, torch.bfloat16, {}, True),
    (2, 64, torch.float32, {}, False),                     # fp32 / fp16: the generic kernels ...
    (2, 64, torch.float16, {}, False),
    (2, 64, torch.float32, dict(force=True), True),        # ... unless forced (the interpreter tests)
    (2, 64, torch.bfloat16, dict(enabled=False), False),   # switched off: the generic kernels for every dtype
    (2, 64, torch.float32, dict(enabled=False, force=True), False),
    (3, 64, torch.bfloat16, {}, False),
    (1, 64, torch.bfloat16, {}, False),
    (2, 20, torch.bfloat16, {}, False),                    # not whole tiles of 8
])
def test_applies_and_what_follows_it(p, d, dtype, switches, want):
    with p2_config.override(**switches):
        assert chunk_p2.applies(p, d, dtype) is want
        assert chunk.state_dtype(p, d, dtype) == (torch.bfloat16 if want and dtype == torch.bfloat16
                                                   else torch.float32)
        cfg = config.dispatch.current()
        assert dispatch.default_chunk(p, d, dtype) == (cfg.chunk_p2 if want and d <= 64 else cfg.default_chunk)


@pytest.mark.parametrize("force", [False, True])
def test_chunked_form_hands_the_p2_family_to_its_entries(monkeypatch, force):
    """chunked_forward / chunked_backward call chunk_p2.forward / backward exactly where applies says so."""
    calls = []
    monkeypatch.setattr(chunk_p2, "forward", lambda *a, **k: calls.append("forward") or "fwd")
    monkeypatch.setattr(chunk_p2, "backward", lambda *a, **k: calls.append("backward") or "bwd")
    q = torch.zeros(1, 16, 2, 16)
    with p2_config.override(force=force):
        if force:
            assert chunk.chunked_forward(q, q, q, None, None, None, 0.25, 2, True, 16) == "fwd"
            assert chunk.chunked_backward(q, None, None, q, q, q, None, None, None, q, None, 0.25, 2, True, False,
                                          16, False) == "bwd"
            assert calls == ["forward", "backward"]
        else:       # fp32 without force: the generic stages (stopped at their first launch, which needs a GPU)
            monkeypatch.setattr(chunk, "intra_forward", lambda *a: calls.append("generic") or 1 / 0)
            with pytest.raises(ZeroDivisionError):
                chunk.chunked_forward(q, q, q, None, None, None, 0.25, 2, True, 16)
            assert calls == ["generic"]


def test_chunk_py_reaches_the_p2_family_through_its_entries_only():
    tree = ast.parse(CHUNK_PY.read_text())
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "chunk_p2"}
    assert used == {"applies", "forward", "backward"}, used
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names if "chunk_p2" in (node.module or "")}
    assert not imported, imported        # no `from .chunk_p2.kernels import ...` beside the package
