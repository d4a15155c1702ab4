"""longctx.kernels.power.switches: 'FIELD=VALUE' items parsed by the field's type, bad items named, overrides that
never outlive their block."""
import pytest

from longctx.kernels.power import config, switches
from longctx.kernels.power.chunk_p2 import config as p2_config


def test_switches_parse_by_field_type():
    assert switches.parse(["outer_stages=3", "offdiag_fp32_grads=1", "p2.qbwd_block=128,8,4", "dispatch.chunk_p2=1024",
                           "offdiag_precision=tf32"]) == {
        "p2": {"outer_stages": 3, "qbwd_block": (128, 8, 4)},
        "attention": {"offdiag_fp32_grads": True, "offdiag_precision": "tf32"},
        "dispatch": {"chunk_p2": 1024}}


def test_an_unknown_matmul_precision_names_the_field():
    with pytest.raises(ValueError, match="offdiag_precision='tf33'"), switches.applied(["offdiag_precision=tf33"]):
        pass


def test_overrides_hold_inside_the_block_only():
    """A variant's switches, dispatch's included, must not leak into the next variant (one once timed later rounds of
    'default' at the previous variant's chunk)."""
    before = (config.dispatch.current(), p2_config.current(), config.attention.current())
    items = [f"default_chunk={before[0].default_chunk // 2}", f"concurrent_bwd={int(not before[1].concurrent_bwd)}",
             f"offdiag_fp32_grads={int(not before[2].offdiag_fp32_grads)}"]
    with switches.applied(items, tiles={"fwd": (64, 32, 4, 3)}):
        assert config.dispatch.current().default_chunk == before[0].default_chunk // 2
        assert p2_config.current().concurrent_bwd is not before[1].concurrent_bwd
        assert config.attention.current().offdiag_fp32_grads is not before[2].offdiag_fp32_grads
        assert config.attention.current().block_override == {"fwd": (64, 32, 4, 3)}
    assert (config.dispatch.current(), p2_config.current(), config.attention.current()) == before
    with pytest.raises(RuntimeError), switches.applied(["outer_stages=2"]):
        raise RuntimeError("a failing variant")
    assert p2_config.current() == before[1]


@pytest.mark.parametrize("item, named", [("nope=1", "no config .* has a field 'nope'"), ("outer_stages", "FIELD=VALUE"),
                                         ("outer_stages=x", "value 'x' is not a int"),
                                         ("x.outer_stages=3", "no family 'x'")])
def test_bad_items_raise_one_named_error(item, named):
    with pytest.raises(switches.SwitchError, match=named):
        switches.parse([item])
