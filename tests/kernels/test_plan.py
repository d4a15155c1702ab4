"""One plan per call (no GPU): plan.make_plan decides the route once (form, family, launcher, chunk), the p=2 family's
decision lives in plan.p2_family alone, the layers below take the plan's fields, and the plan printed for a shape
(`python -m longctx.kernels.plan`) is the route power_attention takes for it: the CUDA routing is run here on CPU
tensors with the launches stopped at their first entry, which records what the plan handed down."""
import ast
import re
from pathlib import Path

import pytest
import torch

from longctx.kernels import plan as plan_cli
from longctx.kernels.power import autograd, chunk, chunk_p2, config, interface, plan
from longctx.kernels.power.chunk_p2 import config as p2_config

POWER = Path(plan.__file__).parent


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
def test_p2_family_and_what_follows_it(p, d, dtype, switches, want):
    with p2_config.override(**switches):
        assert plan.p2_family(p, d, dtype) is want
        made = plan.make_plan(4096, p, d, dtype, form="chunked")
        assert made.family == ("p2" if want else "generic")
        assert plan.state_dtype(made.family, dtype) == (torch.bfloat16 if want and dtype == torch.bfloat16
                                                        else torch.float32)
        cfg = config.dispatch.current()
        assert made.chunk == plan.default_chunk(p, d, dtype) == (cfg.chunk_p2 if want and d <= 64
                                                                 else cfg.default_chunk)


@pytest.mark.parametrize("t, state_in, state_out, want", [
    (1, True, True, "generic"),         # a decoding step: its state is handed on, call after call
    (64, False, True, "generic"),       # a short prompt's state
    (511, True, False, "generic"),
    (512, True, True, "p2"),            # a piece a chunk long or more: rounded once per chunk, the faster family
    (65536, True, True, "p2"),
    (1, False, False, "p2"),            # no state: nothing is carried
])
def test_short_stateful_calls_keep_fp32_states(t, state_in, state_out, want):
    """The p=2 family keeps bf16 inputs' states in bf16; a bf16 call that carries a state over fewer tokens than a
    chunk takes the generic family, whose states are fp32 (a state rounded to bf16 at every decoding step drifts)."""
    assert plan.default_chunk(2, 64, torch.bfloat16) == 512
    made = plan.make_plan(t, 2, 64, torch.bfloat16, form="chunked", state_in=state_in, state_out=state_out)
    assert made.family == want
    assert plan.state_dtype(made.family, torch.bfloat16) == (torch.bfloat16 if want == "p2" else torch.float32)
    with p2_config.override(force=True):     # fp32 states in the p=2 family too: nothing is rounded
        assert plan.make_plan(t, 2, 64, torch.float32, form="chunked", state_in=state_in,
                              state_out=state_out).family == "p2"
    routed = plan.make_plan(t, 2, 64, torch.bfloat16, "cuda", state_in=state_in, state_out=state_out)
    if state_in or state_out:           # what power_attention routes: the chunked form of that family
        assert (routed.form, routed.family) == ("chunked", want)
    else:                               # a stateless token: the attention form, no family
        assert (routed.form, routed.family) == ("attention", "")


def test_the_family_is_decided_in_plan_py_alone():
    """Only plan.py asks p2_family; chunk.py reaches the p=2 family through its two entries, as the plan names it."""
    askers = sorted(str(path.relative_to(POWER)) for path in POWER.rglob("*.py")
                    if "p2_family(" in path.read_text() and path.name != "plan.py")
    assert not askers, askers
    tree = ast.parse((POWER / "chunk.py").read_text())
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "chunk_p2"}
    assert used == {"forward", "backward"}, used
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names if "chunk_p2" in (node.module or "")}
    assert not imported, imported        # no `from .chunk_p2.kernels import ...` beside the package


@pytest.mark.parametrize("family", ["p2", "generic"])
def test_chunked_form_hands_the_p2_family_to_its_entries(monkeypatch, family):
    """chunked_forward / chunked_backward call chunk_p2.forward / backward exactly where the plan's family says so."""
    calls = []
    monkeypatch.setattr(chunk_p2, "forward", lambda *a, **k: calls.append("forward") or "fwd")
    monkeypatch.setattr(chunk_p2, "backward", lambda *a, **k: calls.append("backward") or "bwd")
    q = torch.zeros(1, 16, 2, 16)
    if family == "p2":
        assert chunk.chunked_forward(q, q, q, None, None, None, 0.25, 2, True, 16, family) == "fwd"
        assert chunk.chunked_backward(q, None, None, q, q, q, None, None, None, q, None, 0.25, 2, True, False, 16,
                                      False, family) == "bwd"
        assert calls == ["forward", "backward"]
    else:       # the generic stages (stopped at their first launch, which needs a GPU)
        monkeypatch.setattr(chunk, "intra_forward", lambda *a: calls.append("generic") or 1 / 0)
        with pytest.raises(ZeroDivisionError):
            chunk.chunked_forward(q, q, q, None, None, None, 0.25, 2, True, 16, family)
        assert calls == ["generic"]


class _Launched(Exception):
    """What the first launch entry of a call received."""


def _stop_at_launches(monkeypatch):
    """Every form's first entry below the plan records what it got and stops the call."""
    def stop(kind):
        def entry(*args, **kwargs):
            raise _Launched(kind, args, kwargs)
        return entry
    monkeypatch.setattr(autograd, "attention_forward", stop("attention"))
    monkeypatch.setattr(autograd, "attention_form_op", stop("attention_op"))
    monkeypatch.setattr(autograd, "chunked_forward", stop("chunked"))
    monkeypatch.setattr(autograd, "chunked_form_op", stop("chunked_op"))
    monkeypatch.setattr(interface, "power_attention_reference", stop("reference"))
    monkeypatch.setattr(autograd.native, "lookup", lambda *a: (None, None))   # the Python node (no C++ plans)


def test_the_printed_tiles_name_their_places(capsys):
    """Each stage's tile is printed with its places' names (tunables.FIELDS), never as a bare tuple."""
    assert plan_cli.main(["t=65536", "p=2", "d=64"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[5:]}
    assert lines["intra_fwd"].endswith(" attn_fwd".ljust(53) + " BM=64 BN=32 warps=4 stages=3 maxnreg=96")
    assert lines["intra_dkdv"].endswith(" BM=64 BN=64 warps=4 stages=3")
    stages = plan.plan_of(["t=65536", "p=2", "d=64"]).launches()
    assert set(lines) == set(stages) and all(tile for _, tile in stages.values())
    for stage, line in lines.items():   # the Gluon kernels where Triton has Gluon, else their Triton versions
        shown = line.split("  ")[-1]
        assert "=" in shown and "(" not in shown and len(shown.split()) == len(stages[stage][1]), line
    assert plan_cli.main(["t=8192", "p=1", "d=32", "dtype=fp32", "norm=0"]) == 0
    assert re.search(r"^  states +chunk_update_fwd \+ discumsum +rows=64 cols=32 warps=8 stages=2$",
                     capsys.readouterr().out, re.M)


@pytest.mark.parametrize("items", [
    "t=65536 p=2 d=64",                       # long p=2 bf16: chunked, p=2 kernels
    "t=1024 p=2 d=64",                        # short: attention form
    "t=65536 p=2 d=64 dtype=fp32",            # p=2 outside bf16: attention form
    "t=65536 p=4 d=64",                       # p >= 3: attention form
    "t=65536 p=3 d=64 norm=0",
    "t=8192 p=1 d=32 dtype=fp32 norm=0",      # p=1: chunked, generic kernels
    "t=16384 p=2 d=128",                      # d=128: chunked from 16k
    "t=100 p=2 d=64 state_in=1",              # a state: chunked, at most t long
    "t=300 p=2 d=64 dtype=fp32 chunk_size=64 state_out=1",
    "t=1024 p=2 d=64 compiling=1",            # under torch.compile: custom ops
    "t=65536 p=2 d=64 compiling=1",
    "t=65536 p=2 d=64 device=cpu",            # CPU tensors: the reference
])
def test_the_printed_plan_is_the_route_taken(monkeypatch, capsys, items):
    argv = items.split()
    assert plan_cli.main(argv) == 0
    printed = capsys.readouterr().out
    want = plan.plan_of(argv)
    assert printed.strip() == str(want)
    assert re.search(rf"^form\s+{want.form}\b", printed, re.M) and re.search(rf"^chunk\s+{want.chunk}$", printed, re.M)
    kw = plan.parse_args(argv)
    made = []

    def on_device(t, p, d, dtype, device, **rest):     # the call's own plan, made as for tensors on kw's device
        made.append(plan.make_plan(t, p, d, dtype, kw["device"], **dict(rest, compiling=kw.get("compiling", False))))
        return made[-1]

    monkeypatch.setattr(interface, "make_plan", on_device)
    monkeypatch.delenv(plan.IMPL_ENV, raising=False)
    _stop_at_launches(monkeypatch)
    t, d, dt = kw["t"], kw["d"], kw["dtype"]
    q = k = v = torch.zeros(1, t, 1, d, dtype=dt)
    state = None
    if kw.get("state_in"):
        dim = interface.state_dim(kw["p"], d)
        state = (torch.zeros(1, 1, dim, d), torch.zeros(1, 1, dim))
    with pytest.raises(_Launched) as got:
        interface.power_attention(q, k, v, p=kw["p"], chunk_size=kw.get("chunk_size"), norm=kw.get("norm", True),
                                  initial_state=state, return_state=kw.get("state_out", False))
    assert made == [want]
    kind, args, kwargs = got.value.args
    if want.form == "reference":
        assert kind == "reference" and kwargs["chunk_size"] == want.chunk
    elif want.form == "attention":
        assert kind == ("attention_op" if want.launcher == "custom_op" else "attention")
    elif want.launcher == "custom_op":          # chunked_form_op(q, k, v, log_g, scale, p, norm, C, family)
        assert kind == "chunked_op" and args[7:] == (want.chunk, want.family)
    else:                                       # chunked_forward(q, k, v, gl, s0, z0, scale, p, norm, C, family)
        assert kind == "chunked" and args[9:] == (want.chunk, want.family)
        assert (args[4] is not None) == want.state_in


def test_routing_table_and_impl_env(monkeypatch):
    """make_plan's routing of stateless CUDA calls (config.dispatch's crossings), and LONGCTX_POWER_IMPL, read at each
    call: the plan names the form, chunk and family the call gets."""
    cfg = config.dispatch.current()
    long, short = cfg.chunked_min_t, cfg.chunked_min_t - 1
    monkeypatch.delenv(plan.IMPL_ENV, raising=False)

    def route(t, p, d, dtype, **kw):
        made = plan.make_plan(t, p, d, dtype, compiling=False, **kw)
        return made.form, made.family, made.chunk

    assert route(long, 2, 64, torch.bfloat16) == ("chunked", "p2", cfg.chunk_p2)
    assert route(short, 2, 64, torch.bfloat16) == ("attention", "", None)
    aligned, chunk = cfg.chunked_min_t_aligned, cfg.chunk_p2   # whole chunks: the chunked form from a shorter t
    assert aligned % chunk == 0 and aligned < long
    assert route(aligned, 2, 64, torch.bfloat16) == ("chunked", "p2", chunk)
    assert route(aligned - chunk, 2, 64, torch.bfloat16)[0] == "attention"
    assert route(aligned + chunk // 2, 2, 64, torch.bfloat16)[0] == "attention"    # a padded tail: from `long` on
    assert route(long + chunk // 2, 2, 64, torch.bfloat16)[0] == "chunked"
    assert route(aligned, 4, 64, torch.bfloat16)[0] == "attention"
    assert route(5120, 2, 96, torch.bfloat16)[0] == "attention"       # whole chunks of 1024, but measured at d <= 64
    with config.dispatch.override(chunked_min_t=8192):                # the aligned threshold stays: raise both
        assert route(aligned, 2, 64, torch.bfloat16)[0] == "chunked"
    with config.dispatch.override(chunked_min_t=8192, chunked_min_t_aligned=8192):
        assert route(aligned, 2, 64, torch.bfloat16)[0] == "attention"
    assert route(long, 2, 64, torch.float32) == ("attention", "", None)
    assert route(long, 4, 64, torch.bfloat16) == ("attention", "", None)
    assert route(long, 1, 64, torch.float32) == ("chunked", "generic", cfg.default_chunk)
    assert route(cfg.chunked_min_t_linear - 1, 1, 64, torch.bfloat16)[0] == "attention"
    assert route(long, 2, 128, torch.bfloat16)[0] == "attention"
    assert route(cfg.chunked_min_t_wide, 2, 128, torch.bfloat16) == ("chunked", "p2", cfg.default_chunk)
    assert route(100, 3, 64, torch.bfloat16, state_out=True) == ("chunked", "generic", 100)   # chunk <= t
    assert route(100, 2, 64, torch.bfloat16, chunk_size=32) == ("chunked", "p2", 32)
    assert route(1000, 2, 64, torch.bfloat16, state_in=True, chunk_size=32) == ("chunked", "p2", 32)
    assert route(100, 2, 64, torch.bfloat16, state_in=True, chunk_size=32) == ("chunked", "generic", 32)  # short
    assert plan.make_plan(long, 2, 64, torch.bfloat16, "cpu").form == "reference"
    assert plan.make_plan(long, 2, 64, torch.bfloat16, compiling=True).launcher == "custom_op"
    assert plan.make_plan(100, 2, 64, torch.bfloat16, compiling=True, state_out=True).launcher == "function"
    with config.dispatch.override(chunked_min_t=long + 1, chunked_min_t_aligned=long + 1):   # read at each call
        assert route(long, 2, 64, torch.bfloat16)[0] == "attention"
    monkeypatch.setenv(plan.IMPL_ENV, "chunked")
    assert route(long, 2, 64, torch.float32) == ("chunked", "generic", cfg.default_chunk)
    assert route(short, 2, 64, torch.bfloat16) == ("chunked", "p2", cfg.chunk_p2)                   # any t
    assert route(long, 3, 64, torch.bfloat16)[0] == "attention"                                  # p >= 3
    monkeypatch.setenv(plan.IMPL_ENV, "attention")
    assert route(long, 2, 64, torch.bfloat16)[0] == "attention"
    monkeypatch.setenv(plan.IMPL_ENV, "reference")
    assert route(long, 2, 64, torch.bfloat16) == ("reference", "", None)
    monkeypatch.setenv(plan.IMPL_ENV, "bogus")
    with pytest.raises(ValueError, match=plan.IMPL_ENV):
        route(long, 2, 64, torch.bfloat16)


@pytest.mark.parametrize("items, why", [
    ("t=65536 p=2 d=63", "d=63 is not a supported CUDA head dim (32, 64, 128): power_attention refuses CUDA inputs"),
    ("t=65536 p=2 d=64 dtype=fp32", "dtype=fp32: the p=2 state kernels run bf16 inputs only; without them the "
                                    "attention form is faster than the generic chunked kernels"),
    ("t=65536 p=4 d=64", "p=4: the p=2 state kernels serve p=2 only; without them the attention form is faster"),
    ("t=1024 p=2 d=64", "t=1024 is below {aligned} (config.dispatch chunked_min_t_aligned), from where the chunked"),
    ("t=8192 p=2 d=128", "t=8192 is below {wide} (config.dispatch chunked_min_t_wide)"),
    ("t=100 p=2 d=64 state_in=1", "a state carried over t=100 tokens, fewer than a chunk (512): the generic chunked"),
    ("t=65536 p=2 d=64 form=attention", "form=attention asked"),
    ("t=65536 p=2 d=64 device=cpu", "device=cpu: the PyTorch reference"),
    ("t=4096 p=2 d=20 device=cpu form=chunked", "d=20 is not a multiple of 8: the p=2 state kernels take head dims of "
                                                "whole 8-wide tiles; the generic chunked kernels run instead"),
    ("t=65536 p=2 d=64", None),                        # the fast route: nothing to explain
])
def test_the_printed_plan_says_why_it_leaves_the_fast_route(monkeypatch, capsys, items, why):
    """The line under the form names what keeps the call off the p=2 state kernels' chunked form; the fast route
    prints none."""
    monkeypatch.delenv(plan.IMPL_ENV, raising=False)
    cfg = config.dispatch.current()
    assert plan_cli.main(items.split()) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("form ")
    if why is None:
        assert not any(line.startswith("why ") for line in lines) and plan.plan_of(items.split()).why() == ""
    else:
        want = why.format(aligned=cfg.chunked_min_t_aligned, wide=cfg.chunked_min_t_wide)
        assert lines[2].startswith("why      " + want), lines[2]


def test_plan_is_frozen_and_the_command_line_names_bad_items():
    made = plan.make_plan(65536, 2, 64, torch.bfloat16)
    with pytest.raises(AttributeError):
        made.chunk = 1024
    for bad, word in (("t=1 dtype=fp8", "dtype"), ("t=1 q=3", "q"), ("p=2", "t="), ("t=1 norm=yes", "norm"),
                      ("t=abc", "^t='abc': expected a positive integer"), ("t=-5", "^t="), ("t=1 d=0", "^d="),
                      ("t=1 p=5", "^p='5': expected an integer in 1..4"), ("t=1 p=0", "^p="),
                      ("t=1 chunk_size=0", "^chunk_size="),
                      ("ctx=65536 p=2",
                       r"^'ctx=65536': no argument 'ctx' \(t, .*\); the context length is t \(t=65536\)$")):
        with pytest.raises(ValueError, match=word):
            plan.plan_of(bad.split())
    assert plan_cli.main(["t=1", "dtype=fp8"]) == 2

