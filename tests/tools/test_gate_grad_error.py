"""tools/gate_grad_error.py on the CPU (reference path only): the input-rounding floor it reports is bf16-sized."""
import pytest

gate_grad_error = pytest.importorskip("tools.gate_grad_error")


def test_rounding_floor_is_bf16_sized(tmp_path):
    out = tmp_path / "rows.json"
    rows = gate_grad_error.main(["--device", "cpu", "--tiny", "--out", str(out)])
    assert out.exists() and len(rows) == len(gate_grad_error.TINY_CASES)
    for row in rows:
        assert "kernel_bf16" not in row               # the kernel columns need CUDA
        for name in gate_grad_error.NAMES:
            # bf16 keeps 8 significant bits: rounding q, k, v, dy moves each gradient by ~2^-9 relative, not 0
            # and not percent-level
            assert 1e-4 < row["rounding"][name] < 2e-2, (row, name)


def test_rel_err_is_relative_frobenius():
    import torch
    a = torch.tensor([3.0, 4.0])
    assert gate_grad_error.rel_err(a, a) == 0.0
    assert gate_grad_error.rel_err(a + torch.tensor([0.3, 0.4]), a) == pytest.approx(0.1)
