"""The attention form's C++ node (native/) on CPU: the Triton kernels replaced by fakes that
record each launch (grid, parameters, the tensors behind them) and hand back a compiled-kernel stand-in whose
signature follows Triton's rules (constexprs and None arguments compile away; tensors are pointers, ints i32, floats
fp32). The Python node runs with those fakes and records a plan; the C++ node then runs the same call in its
dry-run mode, and every launch it would make must match the Python path's: kernels, grids, block sizes, scalars,
the input and output tensors, and which parameters share a buffer."""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import shutil
import struct
from types import SimpleNamespace

import pytest
import torch

from longctx.kernels.power import autograd, config, gates
from longctx.kernels.power import parallel as ta
from longctx.kernels.power.native import launcher as native

_TL_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")
_function_ids = itertools.count(1001)


class FakeJit:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kwargs) records the launch and returns a
    CompiledKernel-like object (src.signature, metadata, function)."""

    def __init__(self, fn, log: list):
        self.fn, self.log = fn, log
        self.kernels = {}
        self.scratch = 0      # the compiled kernel's global scratch bytes per program (its tensor descriptors)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in kwargs}
            bound = inspect.signature(self.fn.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            constexpr = {p.name for p in self.fn.params if p.is_constexpr}
            signature, values = {}, []
            for name, value in bound.arguments.items():
                if name in constexpr or value is None or isinstance(value, bool):
                    signature[name] = "constexpr"
                elif isinstance(value, torch.Tensor):
                    signature[name] = "*" + _TL_SHORT[value.dtype]
                    values.append(value)
                elif isinstance(value, int):
                    signature[name] = "i32"
                    values.append(value)
                elif isinstance(value, float):
                    signature[name] = "fp32"
                    values.append(value)
                else:
                    raise TypeError(f"{self.fn.__name__}: argument {name}={value!r}")
            key = tuple(signature.items()) + tuple(sorted(options.items()))
            if key not in self.kernels:
                md = SimpleNamespace(num_warps=options["num_warps"], shared=4096, num_ctas=1, launch_pdl=False,
                                     launch_cooperative_grid=False, global_scratch_size=self.scratch,
                                     profile_scratch_size=0)
                self.kernels[key] = SimpleNamespace(src=SimpleNamespace(signature=signature), metadata=md,
                                                    function=next(_function_ids))
            kernel = self.kernels[key]
            grid2 = tuple(grid) + (1,) * (2 - len(grid))
            self.log.append((kernel, grid2, values))
            return kernel
        return launch


@pytest.fixture
def fake_kernels(monkeypatch):
    log = []
    for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd_prep", "_attn_bwd_dq_finish"):
        monkeypatch.setattr(ta, name, FakeJit(getattr(ta, name), log))
    monkeypatch.setattr(gates, "_segment_cumsum", FakeJit(gates._segment_cumsum, log))
    return log


@pytest.fixture(scope="module")
def built():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    native.start_build(background=False)
    assert native.wait(), native.status()


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _cpp_launches(log: list) -> list:
    """native_launch.cpp's dry-run log -> [(kernel index, function, grid, threads, shared, cells)]."""
    out, i = [], 0
    while i < len(log):
        which, function, gx, gy, threads, shared, n = log[i:i + 7]
        out.append((which, function, (gx, gy), threads, shared, log[i + 7:i + 7 + n]))
        i += 7 + n
    return out


def test_param_tables_name_every_runtime_parameter():
    """Every parameter of the seven kernels that can reach a launch is named by a slot or a constant (a new kernel
    parameter without one would leave the C++ path unable to place it: this fails first)."""
    kernels = [("fwd", ta._attn_fwd), ("dq", ta._attn_bwd_dq), ("dkdv", ta._attn_bwd_dkdv),
               ("prep", ta._attn_bwd_prep), ("dq_finish", ta._attn_bwd_dq_finish),
               ("fwd_scan", gates._segment_cumsum), ("bwd_scan", gates._segment_cumsum)]
    assert sorted(name for name, _ in kernels) == sorted(native.KERNELS)
    none_by_default = {"XT", "W"}            # the chunked form's copies: None (compiled away) in the attention form
    for name, fn in kernels:
        runtime = [p.name for p in fn.params if not p.is_constexpr]
        missing = [a for a in runtime if a not in native.PARAM_TABLES[name] and a not in native._CONSTS
                   and a not in none_by_default]
        assert not missing, (name, missing)


def test_kernel_entry_refuses_what_it_cannot_launch():
    md = SimpleNamespace(num_warps=4, shared=0, num_ctas=1, launch_pdl=False, launch_cooperative_grid=False,
                         global_scratch_size=0, profile_scratch_size=0)
    good = SimpleNamespace(src=SimpleNamespace(signature={"Q": "*bf16", "T": "i32", "HQ": "constexpr"}), metadata=md,
                           function=7)
    entry = native.kernel_entry(good, "fwd", 64, 12)
    assert entry == [1, 7, 4, 0, 64, 12, 0, 2, native.KIND_TENSOR, native.TENSOR_SLOTS.index("Q"),
                     native.KIND_INT, native.SCALAR_SLOTS.index("T")]
    for bad in ({"Q": "*bf16", "EXTRA": "*fp32"},          # a parameter without a slot
                {"Q": "i32"},                              # a pointer slot passed as an int
                {"T": "i64"}):                             # a 64-bit t
        with pytest.raises(native.Unsupported):
            native.kernel_entry(SimpleNamespace(src=SimpleNamespace(signature=bad), metadata=md, function=7),
                                "fwd", 64, 12)
    # global scratch (a kernel's tensor descriptors) is the C++ side's to allocate; profile scratch is not
    scratch = SimpleNamespace(**{**vars(md), "global_scratch_size": 128, "global_scratch_align": 128})
    assert native.kernel_entry(SimpleNamespace(src=good.src, metadata=scratch, function=7), "fwd", 64, 12)[6] == 128
    profiled = SimpleNamespace(**{**vars(md), "profile_scratch_size": 64})
    with pytest.raises(native.Unsupported, match="profile_scratch_size"):
        native.kernel_entry(SimpleNamespace(src=good.src, metadata=profiled, function=7), "fwd", 64, 12)


def test_cpu_tensors_never_take_the_native_path():
    q = torch.randn(1, 16, 2, 32)
    assert native.lookup(q, q, q, None, 2, True) == (None, None)


def test_plan_key_changes_with_every_attention_switch():
    """A plan is compiled kernels for one set of switches: flipping any field of the attention config (one added
    later included) or the gate scan's tile must give a new key, or a stale plan would run."""
    q = torch.randn(1, 16, 2, 32)
    base = native.plan_key(q, q, None, 2, True)
    flips = {"block_override": {"fwd": (64, 64, 4, 3)}, "short_fwd_t": 1, "offdiag_precision": "tf32"}
    for f in dataclasses.fields(config.AttentionConfig):
        value = flips.get(f.name, not getattr(config.attention.current(), f.name))
        with config.attention.override(**{f.name: value}):
            assert native.plan_key(q, q, None, 2, True) != base, f.name
    with config.gates.override(column_tile=512):
        assert native.plan_key(q, q, None, 2, True) != base


def test_plan_key_changes_where_the_masks_fold_away():
    """The kernels drop their row / key masks where t is whole tiles (launch_config's EVEN): a plan recorded at t = 4096
    (whole 64- and 128-row tiles) must not serve t = 4112 (whole 16s, as Triton specializes t, but not whole tiles),
    while lengths of the same whole tiles share one."""
    keys = {t: native.plan_key(torch.randn(1, t, 2, 32), torch.randn(1, t, 2, 32), None, 2, True)
            for t in (4096, 4112, 8192)}
    assert ta.launch_config(64, "dq", *ta.dot_dtype(torch.bfloat16, True, True), t=4096)["EVEN"]
    assert not ta.launch_config(64, "dq", *ta.dot_dtype(torch.bfloat16, True, True), t=4112)["EVEN"]
    assert keys[4096] != keys[4112] and keys[4096] == keys[8192]


def test_plan_key_changes_with_deterministic_mode(monkeypatch):
    """torch's deterministic mode turns the one-kernel backward (dq by atomics) off: a plan recorded outside it must
    not serve a call inside it, nor the other way round."""
    q = torch.randn(1, 16, 2, 32)
    base = native.plan_key(q, q, None, 2, True)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert not ta.fused_backward() and native.plan_key(q, q, None, 2, True) != base


@pytest.mark.parametrize("fused", [False, True], ids=["two_kernel_backward", "fused_backward"])
@pytest.mark.parametrize("gated,norm,hq,hk,t", [(True, True, 4, 2, 48), (False, True, 2, 2, 37),
                                                (True, False, 2, 1, 20), (False, False, 3, 3, 16)])
def test_dry_run_launches_match_the_python_path(built, fake_kernels, gated, norm, hq, hk, t, fused):
    if fused:     # as the bulk-reduction dq's kernel: a descriptor in 128 bytes of global scratch per program
        ta._attn_bwd_dkdv.scratch = 128
    with config.attention.override(fused_backward=fused):
        _dry_run_matches_python(fake_kernels, gated, norm, hq, hk, t, fused)


def _dry_run_matches_python(fake_kernels, gated, norm, hq, hk, t, fused):
    b, d, p, scale = 2, 32, 2 if norm else 3, 0.17
    torch.manual_seed(0)
    q = torch.randn(b, t, hq, d, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, t, hk, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    lg = torch.rand(b, t, hk).log().requires_grad_() if gated else None
    dy = torch.randn(b, t, hq, d, dtype=torch.bfloat16)
    leaves = [x for x in (q, k, v, lg) if x is not None]

    # the Python node with a recorder: its launches (fakes) become a plan
    record = {"key": ("test", gated, norm, hq, hk, t, fused), "grad": True}
    autograd.AttentionForm.apply(q, k, v, lg, scale, p, norm, record).backward(dy)
    plan = native._plans[record["key"]]
    assert plan >= 0
    python = list(fake_kernels)
    backward = ["prep", "dkdv", "dq_finish"] if fused else ["dq", "dkdv"]
    assert [k_ for k_ in native.KERNELS if k_ in record] == \
        (["fwd_scan", "fwd", *backward, "bwd_scan"] if gated else ["fwd", *backward])

    # the C++ node, dry run
    for x in leaves:
        x.grad = None
    torch.ops.longctx_native.set_dry_run(True)
    try:
        y = native.run(plan, q, k, v, lg, scale, p)
        y.backward(dy)
        cpp = _cpp_launches(torch.ops.longctx_native.take_log())
    finally:
        torch.ops.longctx_native.set_dry_run(False)

    assert len(cpp) == len(python)
    order = [n for n in native.KERNELS if n in record]
    for (which, function, grid, threads, shared, cells), (kernel, pgrid, values), name in zip(cpp, python, order):
        assert native.KERNELS[which] == name
        assert function == kernel.function and threads == 32 * kernel.metadata.num_warps
        assert shared == kernel.metadata.shared
        assert grid == pgrid, name
        # Triton's two scratch pointers: the global one's bytes (a dry run logs them for the pointer), profile null
        assert len(cells) == len(values) + 2
        assert cells[-2:] == [pgrid[0] * pgrid[1] * kernel.metadata.global_scratch_size, 0], name
        for cell, value in zip(cells, values):
            if isinstance(value, int):
                assert cell == value, name
            elif isinstance(value, float):
                assert cell == _bits(value), name

    # tensors: the same parameters share a buffer in both paths; inputs are the caller's, outputs what is returned
    def classes(pointers):
        first = {}
        return [first.setdefault(ptr, len(first)) for ptr in pointers]
    py_ptrs = [x.data_ptr() for _, _, values in python for x in values if isinstance(x, torch.Tensor)]
    cpp_ptrs = [c for (_, _, _, _, _, cells), (_, _, values) in zip(cpp, python)
                for c, x in zip(cells, values) if isinstance(x, torch.Tensor)]
    assert classes(py_ptrs) == classes(cpp_ptrs)
    inputs = {x.data_ptr() for x in leaves}
    for py, c in zip(py_ptrs, cpp_ptrs):
        if py in inputs:
            assert c == py
    outputs = {y.data_ptr()} | {x.grad.data_ptr() for x in leaves}
    assert outputs <= set(cpp_ptrs)
    assert y.shape == q.shape and y.dtype == q.dtype
    assert [x.grad.shape for x in leaves] == [x.shape for x in leaves]


def test_disabled_or_failed_build_keeps_the_python_node(monkeypatch):
    """LONGCTX_NATIVE=0: nothing is built and no call is native. A build that fails (no compiler, no ninja) warns
    once, naming the variable, and leaves every call on the Python node."""
    monkeypatch.setattr(native, "_state", {"status": "new", "thread": None, "error": None})
    monkeypatch.setenv(native.ENV, "0")
    assert not native.ready() and native._state["status"] == "new"

    import torch.utils.cpp_extension as cpp

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")
    monkeypatch.setattr(cpp, "load", no_compiler)
    monkeypatch.setenv(native.ENV, "1")
    with pytest.warns(UserWarning, match=f"did not build.*no C\\+\\+ compiler.*{native.ENV}=0"):
        native.start_build(background=False)
    assert native.status().startswith("failed") and not native.ready() and not native.wait()
