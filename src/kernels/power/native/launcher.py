"""The attention form's autograd node and launches in C++ (`native_launch.cpp`), for the short sequences where the
host, not the GPU, sets the pace.

At t = 1k a fwd+bwd of the attention form is ~400 us of GPU time but 600-800 us of host time on an H100 host: a
Python autograd node and five launches through Triton's Python launcher (~25-38 us each; docs/kernels.md). The C++
node allocates the same buffers and launches the same compiled kernels with `cuLaunchKernel`, so its results are the
Python path's bit for bit.

How a call gets there:
1. The extension is built once per machine (torch's cpp_extension, in a background thread at the first CUDA call:
   the caller never waits for the compiler; `wait()` does, for benchmarks and tests).
2. A call whose specialization (dtype, heads, head dim, p, norm, gating, what Triton specializes t on, the tile
   switches) has no plan yet runs the Python node (`autograd.AttentionForm`) with a recorder: its launches
   hand back the compiled kernels, and `register()` turns their signatures into a plan (which tensor or scalar
   each kernel parameter is) for the C++ side. A call without gradients records a forward-only plan.
3. Later calls with that specialization run `torch.ops.longctx_native.attention_form`.
Anything the plan builder does not recognize (a parameter it cannot name, profile scratch memory, clusters) marks the
specialization Python-only: correctness never depends on this module. `LONGCTX_NATIVE=0` turns it off.
"""
from __future__ import annotations

import dataclasses
import os
import struct
import threading
import warnings
from pathlib import Path

import torch

from .. import config
from ..parallel import fused_backward

ENV = "LONGCTX_NATIVE"
SOURCE = Path(__file__).with_name("native_launch.cpp")

# native_launch.cpp's enums
TENSOR_SLOTS = ("Q", "K", "V", "LG", "G", "O", "LSE", "DO", "DELTA", "DQ", "DK", "DV", "DGQ", "DGK", "DLG", "DQA")
SCALAR_SLOTS = ("T", "SCALE", "SCALE_P")
KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_CONST_INT, KIND_CONST_FLOAT = range(5)
# in launch order; a backward runs dq, dkdv, or (the one-kernel backward, parallel.fused_backward) prep, dkdv,
# dq_finish, with dq by atomics into the fp32 scratch DQA
KERNELS = ("fwd_scan", "fwd", "dq", "prep", "dkdv", "dq_finish", "bwd_scan")

# Each kernel's parameters by name: a tensor slot, a scalar slot, or a constant (the value the Python path passes).
_INT, _FLOAT = "i32", "fp32"
_ATTN_SCALARS = {"scale": ("SCALE", _FLOAT), "scale_p": ("SCALE_P", _FLOAT), "T": ("T", _INT)}
_CONSTS = {"CB0": (0, _INT), "NCH": (1, _INT), "T_FULL": (0, _INT), "sqrt_scale_p": (1.0, _FLOAT)}
PARAM_TABLES = {
    "fwd_scan": {"X": "LG", "X2": "LG", "Y": "G", "T": ("T", _INT), "SEG": ("T", _INT)},
    "fwd": {"Q": "Q", "K": "K", "V": "V", "G": "G", "O": "O", "LSE": "LSE", **_ATTN_SCALARS},
    "dq": {"Q": "Q", "K": "K", "V": "V", "G": "G", "DO": "DO", "LSE": "LSE", "DELTA": "DELTA", "DQ": "DQ",
           "DGQ": "DGQ", "O": "O", **_ATTN_SCALARS},
    "dkdv": {"Q": "Q", "K": "K", "V": "V", "G": "G", "DO": "DO", "LSE": "LSE", "DELTA": "DELTA", "DK": "DK",
             "DV": "DV", "DGK": "DGK", "DQA": "DQA", **_ATTN_SCALARS},
    "prep": {"O": "O", "DO": "DO", "DELTA": "DELTA", "DQA": "DQA", "T": ("T", _INT)},
    "dq_finish": {"Q": "Q", "DQA": "DQA", "DQ": "DQ", "DGQ": "DGQ", "T": ("T", _INT)},
    "bwd_scan": {"X": "DGK", "X2": "DGQ", "Y": "DLG", "T": ("T", _INT), "SEG": ("T", _INT)},
}

_lock = threading.Lock()
_state = {"status": "new", "thread": None, "error": None}    # status: new | building | ready | failed | off
_plans: dict = {}          # key -> plan id (int), or -1: this specialization stays on the Python path
_forward_plans: dict = {}  # key -> forward-only plan id


class Unsupported(Exception):
    """A compiled kernel the C++ launcher cannot launch as the Python path does."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _build():
    try:
        import shutil

        from torch.utils.cpp_extension import load
        if shutil.which("ninja") is None:      # the pip package's binary, when its venv's bin is not on PATH
            import ninja
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        # torch's version in the name: a build cached for another torch (same Python and CUDA tags) is not reused
        name = "longctx_native_launch_" + "".join(c if c.isalnum() else "_" for c in torch.__version__)
        load(name=name, sources=[str(SOURCE)], extra_cflags=["-O2"], is_python_module=False, verbose=False)
        _state["status"] = "ready"
    except Exception as e:  # noqa: BLE001 -- no compiler, no ninja, ...: the Python path stays
        _state["status"], _state["error"] = "failed", f"{type(e).__name__}: {e}"
        warnings.warn(f"longctx: the native attention-form launcher did not build ({_state['error'][:300]}); "
                      f"short sequences keep the Python path (set {ENV}=0 to skip the build)", stacklevel=2)


def start_build(background: bool = True) -> None:
    """Build and load the extension once (no-op if started, or if LONGCTX_NATIVE=0)."""
    with _lock:
        if _state["status"] != "new":
            return
        if not enabled():
            _state["status"] = "off"
            return
        _state["status"] = "building"
        if background:
            _state["thread"] = threading.Thread(target=_build, name="longctx-native-build", daemon=True)
            _state["thread"].start()
            return
    _build()


def ready() -> bool:
    """Whether the C++ node can run now; starts the background build at the first call."""
    if not enabled():
        return False
    status = _state["status"]
    if status == "new":
        start_build()
        status = _state["status"]
    return status == "ready"


def wait(timeout: float | None = None) -> bool:
    """Block until the build has finished (benchmarks, tests); True if the C++ node is ready."""
    start_build()
    thread = _state["thread"]
    if thread is not None:
        thread.join(timeout)
    return _state["status"] == "ready"


def status() -> str:
    return _state["status"] + (f" ({_state['error']})" if _state["error"] else "")


def _switches():
    """The switches the compiled kernels (and their grids) depend on: every field of the attention config (dicts as
    sorted items, so the key hashes; a switch added later is in the key without a change here) and the gate scan's
    tile."""
    cfg = config.attention.current()
    fields = tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v
                   for v in (getattr(cfg, f.name) for f in dataclasses.fields(cfg)))
    return fields + (config.gates.current().column_tile,)


def plan_key(q, k, log_g, p: int, norm: bool):
    """What the compiled kernels depend on beyond the pointers: Triton specializes t on t % 16 == 0 and t == 1, the
    forward's tile on t <= short_fwd_t (parallel.blocks), the kernels' masks on whole tiles (launch_config's EVEN: t's
    largest power-of-two factor), and the backward's kernels on parallel.fused_backward (off in torch's deterministic
    mode, which the attention config does not hold)."""
    t = q.shape[1]
    return (q.device.index, q.dtype, None if log_g is None else log_g.dtype, q.shape[2], k.shape[2], q.shape[3], p,
            norm, t % 16 == 0, t == 1, t <= config.attention.current().short_fwd_t, fused_backward(), min(t & -t, 256),
            _switches())


def needs_grad(*tensors) -> bool:
    """Whether autograd records a call on these tensors (None: an absent input, such as log_g)."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def lookup(q, k, v, log_g, p: int, norm: bool):
    """(plan id or None, recorder or None) for one call: a plan to run natively, else maybe a dict for the Python
    path's launches to record their compiled kernels in (see register)."""
    if not q.is_cuda or not ready():
        return None, None
    key = plan_key(q, k, log_g, p, norm)
    plan = _plans.get(key)
    if plan is None:                     # no full plan: a forward-only one serves a call without gradients
        grad = needs_grad(q, k, v, log_g)
        plan = None if grad else _forward_plans.get(key)
        if plan is None:
            return None, {"key": key, "grad": grad}
    return (plan if plan >= 0 else None), None


def run(plan: int, q, k, v, log_g, scale: float, p: int):
    return torch.ops.longctx_native.attention_form(q, k, v, log_g, plan, scale, scale ** p)


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def kernel_entry(kernel, name: str, rows: int, heads: int) -> list:
    """A plan's entry for one compiled kernel (Triton's CompiledKernel: src.signature, metadata, function):
    [present, function, num_warps, shared, rows, heads, scratch, n, (kind, value) * n], scratch the global scratch
    bytes per program (the tensor descriptors a kernel makes; the C++ side allocates them per launch). Raises
    Unsupported."""
    md = kernel.metadata
    for field, fine in (("num_ctas", 1), ("launch_pdl", False), ("launch_cooperative_grid", False),
                        ("profile_scratch_size", 0)):
        if getattr(md, field, fine) != fine:
            raise Unsupported(f"{name}: {field}={getattr(md, field)!r}")
    scratch = int(getattr(md, "global_scratch_size", 0) or 0)
    if scratch and (scratch > 1 << 16 or int(getattr(md, "global_scratch_align", 1)) > 256):
        raise Unsupported(f"{name}: global scratch of {scratch} bytes aligned to {md.global_scratch_align}")
    table = PARAM_TABLES[name]
    params = []
    for arg, ty in kernel.src.signature.items():
        if ty == "constexpr":
            continue
        if arg in _CONSTS:
            value, want = _CONSTS[arg]
            if ty != want:
                raise Unsupported(f"{name}: parameter {arg} has type {ty}, expected {want}")
            params += [KIND_CONST_INT, value] if want == _INT else [KIND_CONST_FLOAT, _f32_bits(value)]
            continue
        if arg not in table:
            raise Unsupported(f"{name}: parameter {arg} ({ty}) has no slot")
        slot = table[arg]
        if isinstance(slot, str):
            if not ty.startswith("*"):
                raise Unsupported(f"{name}: parameter {arg} has type {ty}, expected a pointer")
            params += [KIND_TENSOR, TENSOR_SLOTS.index(slot)]
        else:
            slot, want = slot
            if ty != want:
                raise Unsupported(f"{name}: parameter {arg} has type {ty}, expected {want}")
            params += [KIND_INT if want == _INT else KIND_FLOAT, SCALAR_SLOTS.index(slot)]
    function = kernel.function
    if not function:
        raise Unsupported(f"{name}: no loaded function")
    return [1, int(function), int(md.num_warps), int(md.shared), int(rows), int(heads), scratch, len(params) // 2,
            *params]


def plan_spec(record: dict, hq: int, hk: int, d: int, device: int, norm: bool, gated: bool) -> list:
    """The flat spec native_launch.cpp's register_plan reads, from a recorder filled by the Python path:
    record[name] = (CompiledKernel, rows, heads) for each kernel that ran."""
    spec = [hq, hk, d, device, int(norm), int(gated)]
    for name in KERNELS:
        if name in record:
            kernel, rows, heads = record[name]
            spec += kernel_entry(kernel, name, rows, heads)
        else:
            spec += [0] * 8
    return spec


def register(record: dict, q, k, norm: bool, gated: bool, backward: bool) -> None:
    """Register the plan a recorded Python-path call describes (after its forward if it had no gradients, else after
    its backward). Unsupported kernels mark the specialization Python-only."""
    if _state["status"] != "ready":
        return
    key = record["key"]
    table = _plans if backward else _forward_plans
    if key in table:
        return
    try:
        spec = plan_spec(record, q.shape[2], k.shape[2], q.shape[3], q.device.index or 0, norm, gated)
        table[key] = torch.ops.longctx_native.register_plan(spec)
    except (Unsupported, RuntimeError) as e:     # RuntimeError: the C++ side refused the plan (e.g. too many)
        warnings.warn(f"longctx: native attention-form launcher unsupported here ({e}); Python path kept",
                      stacklevel=2)
        _plans[key] = _forward_plans[key] = -1
