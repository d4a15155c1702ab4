"""tools/ab_switch.py and tools/switches.py without a GPU: variant specs (switches, attention tiles, one clear error
for an item that is neither or names no field), overrides that never outlive their block, and the output
comparison."""

import pytest

from longctx.kernels.power import config
from longctx.kernels.power.chunk_p2 import config as p2_config
from tools import ab_switch, switches


def test_variant_items():
    assert ab_switch.parse_variant("default") == ([], {})
    items, tiles = ab_switch.parse_variant("concurrent_bwd=0+attn:fwd=64,32,4,3,96+attn:bwd=64,64,4,3")
    assert items == ["concurrent_bwd=0"]
    assert tiles == {"fwd": (64, 32, 4, 3, 96), "bwd": (64, 64, 4, 3)}


@pytest.mark.parametrize("spec, named", [("attn:qkv=64,32,4,3", "'qkv'"), ("GLUON_WS", "'GLUON_WS'"),
                                         ("chunk_size=512", "'chunk_size'"), ("outer_stages=x", "'x'"),
                                         ("nope.outer_stages=3", "'nope'"), ("block_override=1", "prefix")])
def test_bad_items_name_themselves(spec, named):
    with pytest.raises(SystemExit, match=named):
        ab_switch.parse_variant(spec)


def test_switches_parse_by_field_type():
    assert switches.parse(["outer_stages=3", "gate_scores=0", "p2.qbwd_block=128,8,4", "dispatch.chunk_p2=1024",
                           "offdiag_precision=tf32"]) == {
        "p2": {"outer_stages": 3, "qbwd_block": (128, 8, 4)},
        "attention": {"gate_scores": False, "offdiag_precision": "tf32"},
        "dispatch": {"chunk_p2": 1024}}


def test_an_unknown_matmul_precision_names_the_field():
    with pytest.raises(ValueError, match="offdiag_precision='tf33'"), switches.applied(["offdiag_precision=tf33"]):
        pass


def test_overrides_hold_inside_the_block_only():
    """A variant's switches, dispatch's included, must not leak into the next variant (one once timed later rounds of
    'default' at the previous variant's chunk)."""
    before = (config.dispatch.current(), p2_config.current(), config.attention.current())
    items = [f"default_chunk={before[0].default_chunk // 2}", f"concurrent_bwd={int(not before[1].concurrent_bwd)}",
             f"gate_scores={int(not before[2].gate_scores)}"]
    with switches.applied(items, tiles={"fwd": (64, 32, 4, 3)}):
        assert config.dispatch.current().default_chunk == before[0].default_chunk // 2
        assert p2_config.current().concurrent_bwd is not before[1].concurrent_bwd
        assert config.attention.current().gate_scores is not before[2].gate_scores
        assert config.attention.current().block_override == {"fwd": (64, 32, 4, 3)}
    assert (config.dispatch.current(), p2_config.current(), config.attention.current()) == before
    with pytest.raises(RuntimeError), switches.applied(["outer_stages=2"]):
        raise RuntimeError("a failing variant")
    assert p2_config.current() == before[1]


def test_disagreement_is_the_relative_error_of_each_output():
    """Each output's Frobenius relative error against the reference: 0 for itself, the closed form for a known
    perturbation (a + e, |e| / |a|), named per output."""
    torch = pytest.importorskip("torch")
    ref = [torch.full((4, 3), 2.0) for _ in ab_switch.NAMES]
    outs = [x.clone() for x in ref]
    outs[2][0, 0] += 1.0                                  # dk: |e| = 1, |ref| = 2 sqrt(12)
    errs = ab_switch.disagreement(outs, ref)
    assert list(errs) == list(ab_switch.NAMES)
    assert errs["y"] == 0.0 and errs["dv"] == 0.0
    assert errs["dk"] == pytest.approx(1.0 / (2.0 * 12 ** 0.5), rel=1e-6)
