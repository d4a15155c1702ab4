"""The tunables table is the one source of the kernels' launch shapes (no GPU): every Triton launch of a form's
forward and backward, run on CPU tensors with the kernels replaced by recorders, takes the tile plan.Plan.launches
shows for its stage, and that tile is the table row plan.Plan.table_keys names; overrides sit on top of the table."""
import contextlib
import dataclasses
import re

import pytest
import torch

from longctx.kernels import plan as plan_cli
from longctx.kernels.power import chunk, config, kernel_index, parallel, plan, tunables
from longctx.kernels.power.chunk_p2 import config as p2_config


def test_every_row_names_a_kernel_and_every_kernel_has_rows():
    assert {k for k, _, _ in tunables.TABLE} == set(tunables.KERNELS)
    for kernel, d, dtype in tunables.TABLE:
        assert d is None or d > 0, (kernel, d)
        assert dtype in ("bf16", "fp16", "fp32", tunables.ANY), (kernel, dtype)


def test_lookup_takes_the_smallest_bound_at_or_above_d_and_the_own_dtype_first():
    assert tunables.key("attn_fwd", 64, torch.bfloat16) == ("attn_fwd", 64, "bf16")
    assert tunables.key("attn_fwd", 32, torch.float16) == ("attn_fwd", 64, "*")
    assert tunables.key("attn_fwd", 128, torch.bfloat16) == ("attn_fwd", None, "*")
    assert tunables.key("attn_fwd", 128, torch.float32) == ("attn_fwd", None, "fp32")
    assert tunables.find("attn_fwd_short", 32, "bf16") is None and tunables.find("attn_fwd_short", 128, "bf16") is None
    assert tunables.find("intra_fwd", 64, "fp32") is None
    with pytest.raises(LookupError, match="attn_fwd_short"):
        tunables.tile("attn_fwd_short", 128, "bf16")
    with pytest.raises(KeyError, match="nope"):
        tunables.key("nope", 64)


class _Recorder:
    """Stands in for a Triton kernel: kernel[grid](*args, **kwargs) records the kernel's name and keyword arguments."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.log.append((self.name, kwargs))


# the kernels a CPU run can reach (the Gluon ones launch only on CUDA)
TRITON_KERNELS = [name for name, k in kernel_index.INDEX.items() if "gluon" not in k.module]


@contextlib.contextmanager
def _recording():
    """Every Triton launch recorded under its kernel_index name, through the index's own stand-in: a launch that
    bypassed the index (a kernel imported by value) would run the real kernel and not be recorded."""
    log = []
    with kernel_index.stand_in({name: _Recorder(name, log) for name in TRITON_KERNELS}):
        yield log


def _tile(name, kw):
    """The launch's tile, in the shape its table rows have."""
    opts = (kw["num_warps"], kw["num_stages"]) + ((kw["maxnreg"],) if "maxnreg" in kw else ())
    if name.startswith("attn_"):
        return (kw["BM"], kw["BN"]) + opts
    rows = kw.get("BK", kw.get("BM"))
    if name.startswith("sym2_"):
        return (kw.get("JG", 1), rows) + opts   # the row-scaled kernels' entries have JG = 1
    return (rows, kw.get("BD")) + opts          # generic state kernels: (rows, BD, warps, stages)


def _run(pl: plan.Plan):
    """The plan's form, forward and backward, on (1, t, 2, d) CPU tensors (GQA 2:1 where the form allows it)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, pl.t, 2, pl.d, generator=g).to(pl.dtype) for _ in range(3))
    lg = -torch.rand(1, pl.t, 2, generator=g)
    scale = pl.d ** -0.5
    if pl.form == "attention":
        o, lse, G = parallel.attention_forward(q, k, v, lg, scale, pl.p, pl.norm)
        parallel.attention_backward(torch.ones_like(o), q, k, v, G, o, lse, scale, pl.p, pl.norm, True)
        return
    y, S, Z, lse, G = chunk.chunked_forward(q, k, v, lg, None, None, scale, pl.p, pl.norm, pl.chunk, pl.family)
    chunk.chunked_backward(torch.ones_like(y), None, None, q, k, v, G, S, Z, y, lse, scale, pl.p, pl.norm, True,
                           pl.chunk, False, pl.family)


PLANS = [   # (t, p, d, dtype, form, P2Config changes)
    (128, 2, 64, torch.bfloat16, "attention", {}),      # the short forward tile
    (4096, 2, 64, torch.bfloat16, "attention", {}),
    (256, 2, 128, torch.bfloat16, "attention", {}),
    (256, 2, 32, torch.float16, "attention", {}),
    (256, 4, 64, torch.float32, "attention", {}),
    (256, 1, 32, torch.float32, "chunked", {}),         # generic: F = 32
    (256, 2, 16, torch.float32, "chunked", {}),         # generic (fp32 without force): F = 64
    (256, 4, 16, torch.float32, "chunked", {}),         # generic: F = 256 (chunk_state_wide)
    (256, 2, 64, torch.bfloat16, "chunked", {}),        # p2 (their Triton versions on CPU tensors)
    (256, 2, 128, torch.bfloat16, "chunked", {}),       # p2, grouped query backward
    (256, 2, 32, torch.bfloat16, "chunked", {}),        # p2, the d <= 32 rows
    (256, 2, 16, torch.float32, "chunked", {"force": True}),
]


@pytest.mark.parametrize("t, p, d, dtype, form, p2", PLANS, ids=lambda x: str(x).replace("torch.", ""))
def test_every_launch_takes_its_table_row(t, p, d, dtype, form, p2):
    with p2_config.override(**p2):
        pl = plan.make_plan(t, p, d, dtype, "cpu", chunk_size=64, form=form)
        stages, keys = pl.launches(), pl.table_keys()
        with _recording() as log:
            _run(pl)
    assert pl.family == ("p2" if form == "chunked" and (p2 or dtype == torch.bfloat16) and p == 2 else
                         "generic" if form == "chunked" else "")
    for stage, (kernel, tile) in stages.items():      # no override: the row itself (no row: launch constants)
        assert tile == (tunables.TABLE[keys[stage]] if stage in keys else None), (stage, keys.get(stage))
    # {launched kernel: its stage's tile}; a stage's kernel string names its kernel_index kernel first
    want = {re.split(r" [+(]", kernel)[0]: tile for kernel, tile in stages.values()}
    assert {name for name, _ in log if name in want} == set(want), sorted({name for name, _ in log})
    tiled = [(name, kw) for name, kw in log if want.get(name) is not None]
    for name, kw in tiled:
        got, entry = _tile(name, kw), want[name]
        if name.startswith(("sym2_", "attn_")):
            assert got == tuple(entry), (name, got, entry)
        else:
            rows, bd, warps, stages_ = entry
            assert got[0] == rows and got[1] in (bd, None) and got[2:] == (warps, stages_), (name, got, entry)
    # the shared stages' own rows: the scan over chunks and the gate scan
    for name, kw in log:
        if name == "discumsum":
            assert kw["BLOCK"] == tunables.tile("discumsum", d)[0] == config.chunk.current().discumsum_block
        if name == "segment_cumsum":
            assert kw["BT"] == tunables.tile("segment_cumsum", d)[0]
        if name == "transpose_heads":
            assert (kw["BT"], kw["num_warps"]) == tunables.tile("transpose_heads", d)
        if name == "norm_scan":
            assert kw["BI"] == min(tunables.tile("norm_scan", d)[0], d)


def test_overrides_sit_on_top_of_the_table():
    pl = plan.make_plan(256, 2, 64, torch.bfloat16, "cpu", chunk_size=64, form="chunked")
    with config.attention.override(block_override={"dq": (32, 32, 4, 1)}), \
            p2_config.override(block_override={"kbwd": (1, 32, 4, 1)}):
        stages = pl.launches()
        with _recording() as log:
            _run(pl)
    assert stages["intra_dq"][1] == (32, 32, 4, 1) and stages["key_dk"][1] == (1, 32, 4, 1)
    assert {(kw["BM"], kw["BN"]) for name, kw in log if name == "attn_dq"} == {(32, 32)}
    assert {(kw["JG"], kw["BK"]) for name, kw in log if name == "sym2_kbwd"} == {(1, 32)}
    assert pl.table_keys()["intra_dq"] == ("attn_dq", 64, "bf16")      # the row the override replaced


def test_the_command_line_prints_the_rows_a_plan_reads(capsys):
    assert plan_cli.main(["--tunables", "t=65536", "p=2", "d=64"]) == 0
    out = capsys.readouterr().out
    want = plan.plan_of(["t=65536", "p=2", "d=64"])
    assert out.strip() == want.describe(rows=True)
    for stage, key in want.table_keys().items():
        assert f"{tunables.describe(key)}" in out and tunables.named(key[0], tunables.TABLE[key]) in out, stage
    assert "  intra_fwd     intra_fwd[d<=64,bf16]" in out and " BM=64 BN=32 warps=4 stages=3 maxnreg=96\n" in out
    assert "gluon_query_fwd_rows[any d,bf16]" in out and " rows=128 warps=8 slots=8 maxnreg=128\n" in out
    assert not re.search(r"\(\d+(, \d+)*\)", out), out    # no tile as a bare tuple


def test_every_place_of_an_entry_has_a_name():
    """tunables.FIELDS names every place of every kernel's entries (the plan prints tiles by them), as KERNELS does."""
    assert set(tunables.FIELDS) == set(tunables.KERNELS)
    for (kernel, d, dtype), entry in tunables.TABLE.items():
        assert entry is None or len(entry) <= len(tunables.FIELDS[kernel]), (kernel, d, dtype, entry)
    assert tunables.named("attn_fwd", (128, 64, 4, 4)) == "BM=128 BN=64 warps=4 stages=4"
    assert tunables.named("sym2_kdv_rows", (1, 128, 4, 1, 168)) == "JG=1 rows=128 warps=4 stages=1 maxnreg=168"
    assert tunables.named("gluon_outer", (2, 64, 4)) == "JG=2 rows=64 stages=4"   # the launch's ring stages added
    assert tunables.named("attn_fwd", None) == "None" and tunables.named("", (1, 2)) == "(1, 2)"


@pytest.mark.parametrize("mode", ["default", "switch_off", "deterministic", "tma"])
def test_attention_backward_launches_what_the_plan_prints(mode, monkeypatch):
    """The attention form's backward is one key-block kernel adding dq by atomics between a prep and a finish pass,
    unless fused_backward is off or torch runs deterministic algorithms (the atomics' order varies): then the dq and
    dk/dv kernels. The plan printed for the call names the same kernels in the same order. With tma_dq (on a card
    with TMA, stood in for here) the one kernel adds dq by bulk reductions, and a CUDA plan says so."""
    if mode == "tma":
        monkeypatch.setattr(config.attention, "_current", dataclasses.replace(config.attention.current(),
                                                                            tma_dq=True))
    if mode == "switch_off":
        monkeypatch.setattr(config.attention, "_current",
                            dataclasses.replace(config.attention.current(), fused_backward=False))
    if mode == "deterministic":
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    log = []
    names = ("attn_dq", "attn_dkdv", "attn_bwd_prep", "attn_dq_finish", "segment_cumsum")
    b, t, d = 1, 64, 16
    q, k, G, lse = torch.zeros(b, t, 2, d), torch.zeros(b, t, 1, d), torch.zeros(b, t, 1), torch.zeros(b, t, 2)
    with kernel_index.stand_in({name: _Recorder(name, log) for name in names}), monkeypatch.context() as card:
        if mode == "tma":   # these CPU tensors stand in for a card with TMA, for the launch only
            card.setattr(parallel, "tma_dq", lambda device: True)
        parallel.attention_backward(q, q, k, k, G, q, lse, 0.25, 2, True, True)
    fused, tma = mode in ("default", "tma"), mode == "tma"
    want = ["attn_bwd_prep", "attn_dkdv", "attn_dq_finish"] if fused else ["attn_dq", "attn_dkdv"]
    assert [(name, kw.get("ATOMIC_DQ", False), kw.get("TMA_DQ", False)) for name, kw in log] == \
        [(name, fused and name == "attn_dkdv", tma and name == "attn_dkdv") for name in want] \
        + [("segment_cumsum", False, False)]
    stages = plan.make_plan(t, 2, d, torch.bfloat16, "cuda", compiling=False, form="attention").launches()
    assert [kernel.split(" ")[0] for stage, (kernel, _) in stages.items() if stage != "fwd"] == want
    if fused:
        adds = "bulk reductions" if tma else "atomics"
        assert stages["dkdv"][0] == f"attn_dkdv (+ dq by {adds})"
        cpu = plan.make_plan(t, 2, d, torch.float32, "cpu", compiling=False, form="attention").launches()
        assert cpu["dkdv"][0] == "attn_dkdv (+ dq by atomics)"      # the interpreter: no bulk reductions
