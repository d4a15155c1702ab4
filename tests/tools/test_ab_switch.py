"""tools/ab_switch.py without a GPU: variant specs (switches, attention tiles, one clear error for an item that is
neither or names no field) and the output comparison. The switches themselves: tests/kernels/test_switches.py."""

import pytest

from tools import ab_switch


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
