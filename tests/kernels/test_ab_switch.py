"""scripts/gpu/ab_switch.py without a GPU: its variant specs (switches, attention tiles, one clear error for an item
that is neither) and its output comparison."""

import pytest


@pytest.fixture(scope="module")
def ab_switch(import_script):
    return import_script("gpu/ab_switch")


def test_variant_items(ab_switch):
    assert ab_switch.parse_variant("default") == ([], {})
    switches, tiles = ab_switch.parse_variant("CONCURRENT_BWD=0+attn:fwd=64,32,4,3,96+attn:bwd=64,64,4,3")
    assert switches == ["CONCURRENT_BWD=0"]
    assert tiles == {"fwd": (64, 32, 4, 3, 96), "bwd": (64, 64, 4, 3)}


@pytest.mark.parametrize("spec, named", [("attn:qkv=64,32,4,3", "'qkv'"), ("GLUON_WS", "'GLUON_WS'")])
def test_bad_items_name_themselves(ab_switch, spec, named):
    with pytest.raises(SystemExit, match=named):
        ab_switch.parse_variant(spec)


def test_disagreement_is_the_relative_error_of_each_output(ab_switch):
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


def test_restore_undoes_every_module_switch(ab_switch):
    """A variant's switches, dispatch's included (CHUNKED_DEFAULT_C), must not leak into the next variant: session 23's
    A/B timed later rounds of 'default' at the previous variant's chunk before dispatch was in the snapshot."""
    from longctx.kernels.power import dispatch, triton_attention, triton_sym2
    base = ab_switch.snapshot()
    before = (dispatch.CHUNKED_DEFAULT_C, triton_sym2.CONCURRENT_BWD, triton_attention.GATE_SCORES)
    ab_switch.apply_switches([f"CHUNKED_DEFAULT_C={before[0] // 2}", f"CONCURRENT_BWD={int(not before[1])}",
                              f"GATE_SCORES={int(not before[2])}"])
    triton_attention.BLOCK_OVERRIDE["fwd"] = (64, 32, 4, 3)
    assert (dispatch.CHUNKED_DEFAULT_C, triton_sym2.CONCURRENT_BWD, triton_attention.GATE_SCORES) != before
    ab_switch.restore(base)
    assert (dispatch.CHUNKED_DEFAULT_C, triton_sym2.CONCURRENT_BWD, triton_attention.GATE_SCORES) == before
    assert triton_attention.BLOCK_OVERRIDE == {}


def test_unknown_switch_names_itself_and_the_modules(ab_switch):
    with pytest.raises(SystemExit, match="none of triton_sym2, triton_attention, dispatch, gates has a switch 'CHUNK_SIZE'"):
        ab_switch.apply_switches(["CHUNK_SIZE=512"])
