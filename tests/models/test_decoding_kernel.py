"""The fused decoding-step kernel of power attention (kernels/power/decode_kernel.py): under TRITON_INTERPRET=1 on
CPU against the float64 plain-torch step (p = 1..4, gated and ungated, d = 16/32) and inside the static decoder of
tiny models against a full forward (in a subprocess, see _decode_interpret_check.py), compiled for sm_90 on this
machine (what the interpreter accepts the compiler may reject), its dispatch (CPU -> the plain-torch step) and its custom op (fake tensor, in-place under torch.compile)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longctx.kernels import power_decode_step, power_state_step, symmetric_power_indices
from longctx.kernels.power.decode import gate_log
from longctx.models.attention.shared import HeadGate
from longctx.kernels.power.decode_kernel import PROGRAMS_PER_SM, block_rows, split_for


def run_interpreted(*args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    script = Path(__file__).with_name("_decode_interpret_check.py")
    proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=1800)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def test_fused_step_under_interpreter_quick_set():
    out = run_interpreted()
    assert out.count("ok  ") == 15 + 5 and "FAIL" not in out    # 15 kernel cases, 5 models decoding on the kernel


@pytest.mark.slow  # every p x d x gated x norm x (1, 2 query heads a key head): minutes in the interpreter
def test_fused_step_under_interpreter_every_case():
    out = run_interpreted("full")
    assert out.count("ok  ") == 96 and "FAIL" not in out


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("p", [2, pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow),
                               pytest.param(4, marks=pytest.mark.slow)])
def test_fused_step_compiles_for_sm90(p):
    """d=64, bf16 inputs, fp32 state: as a batch-1 GPT-2 small launch splits it and with one program per head; it
    fits the H100/H200 shared memory, a register file of 255 and spills nothing, within the registers that
    PROGRAMS_PER_SM programs an SM leave a thread."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import H100_SHARED, compile_decode
    built = compile_decode(p, 64, "bf16")
    assert len(built) == (1 if p == 1 else 2), built       # p=1: D = d = 64 rows, one block, never split
    for name, shared, regs, stack in built:
        assert shared <= H100_SHARED and (regs is None or regs <= 255) and not stack, (name, shared, regs, stack)
        assert regs is None or regs <= 65536 // (PROGRAMS_PER_SM * 128), (name, regs)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("rep", [4, pytest.param(2, marks=pytest.mark.slow)])
def test_fused_step_with_grouped_queries_compiles_without_spills(rep):
    """GQA (rep query heads a key head): block_rows shrinks the state tile by rep, so p=2 still fits
    PROGRAMS_PER_SM programs an SM with no spills (the whole tile at 4 query heads spills)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import H100_SHARED, compile_decode
    assert block_rows(64, rep) * rep == block_rows(64)
    for name, shared, regs, stack in compile_decode(2, 64, "bf16", rep=rep):
        assert shared <= H100_SHARED and not stack and (regs is None or regs <= 65536 // (PROGRAMS_PER_SM * 128)), (
            name, regs, stack)


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_fused_step_tuning_knobs_compile_without_spills():
    """The bench's state-step variants (the shares read 16 at a time, the state loaded first) still fit
    PROGRAMS_PER_SM programs an SM at p=2 with no spills."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from tools.compile_check import H100_SHARED, compile_decode
    for name, shared, regs, stack in compile_decode(2, 64, "bf16", SPLIT_CHUNK=16, STATE_FIRST=True):
        assert shared <= H100_SHARED and not stack and (regs is None or regs <= 65536 // (PROGRAMS_PER_SM * 128)), (
            name, regs)


@pytest.mark.parametrize("p, D, d, heads, sms", [(2, 2304, 64, 12, 132), (2, 2304, 64, 768, 132), (1, 64, 64, 1, 132),
                                                 (3, 52224, 64, 12, 132), (2, 100, 16, 3, 1)])
def test_split_covers_every_block_once_in_one_wave(p, D, d, heads, sms):
    """Every block of a head's rows in exactly one program, none empty, and no more programs than one wave (or one
    a head where the heads alone are more)."""
    split, per = split_for(D, d, heads, sms)
    blocks = -(-D // block_rows(d))
    assert 1 <= split <= blocks and (split - 1) * per < blocks <= split * per
    assert split * heads <= max(PROGRAMS_PER_SM * sms, heads)
    if (p, D, heads) == (2, 2304, 12):  # GPT-2 small at batch 1 on an H200: a block a program, 216 programs
        assert (split, per) == (18, 1)


def test_dispatch_on_cpu_is_the_plain_torch_step():
    """CPU tensors (fused or not) take power_state_step: the same output and state, bit for bit."""
    g = torch.Generator().manual_seed(0)
    index, weight = symmetric_power_indices(2, 16)
    s, z = torch.randn(1, 2, index.shape[1], 16, generator=g), torch.rand(1, 2, index.shape[1], generator=g)
    q, k, v = (torch.randn(1, 1, 2, 16, generator=g) for _ in range(3))
    log_g = -torch.rand(1, 1, 2, generator=g)
    s2, z2 = s.clone(), z.clone()
    y = power_decode_step(s, z, index.int(), weight, torch.zeros(2, dtype=torch.int32), q, k, v, log_g, 2, True, 0.25)
    y2 = power_state_step(s2, z2, index, weight, q, k, v, log_g, 2, True, 0.25)
    assert torch.equal(y, y2) and torch.equal(s, s2) and torch.equal(z, z2)


def op_args(g, p=2, d=16, hq=2, hk=1, gated="log"):
    """The op's arguments: s, z, index, weight, ticket, q, k, v, log_g, gate_x, gate_w, gate_b, p, norm, scale."""
    index, weight = symmetric_power_indices(p, d)
    D = index.shape[1]
    gate = (torch.randn(1, 1, 24, generator=g), torch.randn(hk, 24, generator=g), torch.randn(hk, generator=g))
    return (torch.randn(1, hk, D, d, generator=g), torch.rand(1, hk, D, generator=g), index.int(), weight,
            torch.zeros(hk, dtype=torch.int32), *(torch.randn(1, 1, h, d, generator=g) for h in (hq, hk, hk)),
            -torch.rand(1, 1, hk, generator=g) if gated == "log" else None,
            *(gate if gated == "x" else (None, None, None)), p, True, d ** -0.5)


def test_gate_log_is_the_models_head_gate():
    """The gate the fused kernel computes from its input is the models' HeadGate, bit for bit (CPU)."""
    gate = HeadGate(32, 4)
    torch.nn.init.normal_(gate.weight)
    x = torch.randn(2, 3, 32)
    assert torch.equal(gate_log(x, gate.weight, gate.bias), gate(x))


def test_gate_and_log_g_together_are_refused():
    args = op_args(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="give log_g or gate, not both"):
        power_decode_step(*args[:9], 2, True, 0.25, gate=(torch.ones(1, 1, 4), torch.ones(1, 4), torch.ones(1)))


@pytest.mark.parametrize("gated", ["log", "x", None], ids=["log_g", "gate_input", "ungated"])
def test_custom_op_registration(gated):
    """The op's schema, fake tensor and declared mutations agree with what it does (torch.library.opcheck)."""
    torch.library.opcheck(torch.ops.longctx.power_decode_step.default, op_args(torch.Generator().manual_seed(1),
                                                                                gated=gated),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.slow  # compiles with inductor on CPU (seconds)
def test_compiled_graph_updates_the_state_in_place():
    """Under torch.compile the op writes the state's own buffers (no copy of the state and back) and gives the eager
    op's numbers."""
    g = torch.Generator().manual_seed(2)
    args = op_args(g, gated="x")
    eager = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ptr = args[0].data_ptr()

    def step(s, z, index, weight, ticket, q, k, v, log_g, gate_x, gate_w, gate_b):
        return torch.ops.longctx.power_decode_step(s, z, index, weight, ticket, q * 1.5, k, v, log_g, gate_x, gate_w,
                                                   gate_b, 2, True, 0.25)

    y = torch.compile(step, fullgraph=True)(*args[:12])
    y_ref = torch.ops.longctx.power_decode_step(*eager[:5], eager[5] * 1.5, *eager[6:12], 2, True, 0.25)
    assert args[0].data_ptr() == ptr
    torch.testing.assert_close(y, y_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(args[0], eager[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(args[1], eager[1], rtol=1e-6, atol=1e-7)
