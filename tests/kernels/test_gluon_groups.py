"""chunk_p2.kernels.gluon_groups, the Gluon outer products' group tables, against the reference's tiled symmetric power
(no GPU): every accumulator row of every group holds the product its table row says, each feature of the layout is
written by exactly one group, and the keys' multiplicities the kernel forms from the column tiles are the reference's
weights."""
import pytest
import torch

from longctx.kernels.power.chunk_p2 import kernels as p2_kernels
from longctx.kernels.power.reference import expand, state_dim


@pytest.mark.parametrize("d,jg", [(32, 2), (64, 2), (64, 1), (128, 1), (128, 2)])
def test_gluon_groups_cover_the_layout_once_with_the_right_products(d, jg):
    tw, nt = p2_kernels.TILE2, d // p2_kernels.TILE2
    grp, grows = p2_kernels.gluon_groups(d, jg, "cpu")
    assert grp.dtype == grows.dtype == torch.int32 and grows.shape == (grp.shape[0], tw * tw * jg)
    x = torch.randn(d, dtype=torch.float64)
    phi = expand(x, 2)                                                       # (DS,): x_i x_j at each layout row
    weight = expand(torch.ones(d, dtype=torch.float64), 2, weighted=True)    # the multiplicities 1 / 2
    seen = torch.zeros(state_dim(2, d), dtype=torch.int64)
    for (ti, tj, tjb), rows in zip(grp.tolist(), grows.tolist()):
        for f, row in enumerate(rows):
            a, c = f // (tw * jg), f % tw
            jt = tjb if f % (tw * jg) >= tw else tj
            if row < 0:
                assert jt >= nt, (ti, tj, tjb, f)
                continue
            assert phi[row] == x[tw * ti + a] * x[tw * jt + c], (ti, tj, tjb, f, row)
            assert weight[row] == (1.0 if jt == ti else 2.0), (ti, tj, tjb, f, row)   # gluon_outer._group_zrows
            seen[row] += 1
    assert bool((seen == 1).all()), seen
    half_empty = sum(r.count(-1) == tw * tw for r in grows.tolist())
    assert half_empty == (0 if jg == 1 else (nt // 2) % 2)      # the half-empty last groups paired
    if (d, jg) == (64, 2):
        assert grp.shape[0] == 18 and p2_kernels.groups(d, jg, "cpu").shape[0] == 20
