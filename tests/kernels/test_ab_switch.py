"""scripts/gpu/ab_switch.py's variant specs (parsed without a GPU): switches, attention tiles, and one clear error for
an item that is neither."""
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ab_switch():
    paths = [str(REPO / "scripts"), str(REPO / "scripts" / "gpu")]
    sys.path[:0] = paths
    try:
        import ab_switch
    finally:
        del sys.path[:len(paths)]
    return ab_switch


def test_variant_items(ab_switch):
    assert ab_switch.parse_variant("default") == ([], {})
    switches, tiles = ab_switch.parse_variant("CONCURRENT_BWD=0+attn:fwd=64,32,4,3,96+attn:bwd=64,64,4,3")
    assert switches == ["CONCURRENT_BWD=0"]
    assert tiles == {"fwd": (64, 32, 4, 3, 96), "bwd": (64, 64, 4, 3)}


@pytest.mark.parametrize("spec, named", [("attn:qkv=64,32,4,3", "'qkv'"), ("GLUON_WS", "'GLUON_WS'")])
def test_bad_items_name_themselves(ab_switch, spec, named):
    with pytest.raises(SystemExit, match=named):
        ab_switch.parse_variant(spec)
