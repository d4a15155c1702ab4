"""kernel_index names every power-attention kernel once (no GPU): each name resolves to the Triton / Gluon function its
launches call, its tiles are the tunables table's, every table kernel belongs to a launched one, stand_in replaces
launches and restores them (tests/test_import_graph.py checks that no tool reaches a kernel by its private name)."""
import pytest
import torch
import triton

from longctx.kernels.power import kernel_index, plan, tunables


@pytest.mark.parametrize("name", sorted(kernel_index.INDEX))
def test_every_name_is_the_function_its_launches_call(name):
    fn = kernel_index.jit(name)
    assert isinstance(fn, triton.runtime.JITFunction), (name, type(fn))
    assert fn.fn.__name__ == kernel_index.profile_name(name)         # what profiles and compile reports print
    assert kernel_index.of_profile(kernel_index.profile_name(name)) == name
    assert set(kernel_index.entry(name).tiles) <= set(tunables.KERNELS), name


def test_every_table_kernel_is_read_by_an_indexed_kernel():
    read = {tile for k in kernel_index.INDEX.values() for tile in k.tiles}
    assert read == set(tunables.KERNELS)
    assert kernel_index.of_profile("vectorized_elementwise_kernel") is None


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(KeyError, match=r"kernel='attn_fw'.*attn_fwd"):
        kernel_index.jit("attn_fw")


def test_stand_in_replaces_the_launch_and_restores_it_after_an_error():
    real = kernel_index.jit("discumsum")
    fake = object()
    with pytest.raises(RuntimeError, match="inside"):
        with kernel_index.stand_in({"attn_fwd": fake, "discumsum": fake}):
            assert kernel_index.jit("discumsum") is fake and kernel_index.jit("attn_fwd") is fake
            raise RuntimeError("inside")
    assert kernel_index.jit("discumsum") is real
    assert isinstance(kernel_index.jit("attn_fwd"), triton.runtime.JITFunction)


@pytest.mark.parametrize("form, p, d", [("attention", 2, 64), ("chunked", 2, 64), ("chunked", 3, 16)])
def test_a_plan_names_its_launches_by_the_index(form, p, d):
    pl = plan.make_plan(1024, p, d, torch.bfloat16, "cpu", chunk_size=256, form=form)
    names = [name for kernel, _ in pl.launches().values() for name in kernel.split(" (")[0].split(" + ")]
    assert names and all(name in kernel_index.INDEX for name in names), names


def test_the_plan_command_lists_every_kernel(capsys):
    from longctx.kernels import plan as plan_cli
    assert plan_cli.main(["--kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [[name, k.attr] for name, k in kernel_index.INDEX.items()]
