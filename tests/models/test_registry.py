"""The architecture registry: every architecture registers itself under its conf file's name, build_model and
ModelSpec look it up there, and a native time mixing (RWKV-7's rule) is found by the registry, not by a name the
model compares against."""
from pathlib import Path

import pytest
import torch.nn as nn

import longctx.models as models
from longctx.models import ARCHITECTURES, ATTENTIONS, NATIVE_MIXINGS, ModelSpec, build_model, native_mixing
from longctx.models.registry import register_architecture, register_native_mixing
from longctx.models.spec import ARCHS
from _checks import model_cases, tiny_spec

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_every_architecture_registers_itself_under_its_conf_name():
    assert ARCHITECTURES and set(ARCHITECTURES) == {p.stem for p in (CONF / "arch").glob("*.yaml")}
    assert ARCHS == tuple(ARCHITECTURES)
    for name, cls in ARCHITECTURES.items():
        assert cls.arch_name == name and cls.__module__.startswith(f"{models.__name__}.")


@pytest.fixture
def toy_architecture():
    """A model class registered for the test's duration (the registry as it was afterwards)."""
    @register_architecture("toy")
    class Toy(nn.Module):
        def __init__(self, spec):
            super().__init__()
            self.spec = spec
    yield Toy
    del ARCHITECTURES["toy"]


def test_build_model_and_the_spec_look_the_architecture_up(toy_architecture):
    spec = ModelSpec(arch="toy", vocab_size=11, d_model=32, n_heads=2, n_layers=1, ctx=8)
    model = build_model(spec)
    assert isinstance(model, toy_architecture) and model.spec is spec
    with pytest.raises(ValueError, match="architecture 'toy' is registered twice"):
        register_architecture("toy")(toy_architecture)


def test_unknown_architecture_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^ModelSpec\.arch='mamba': unknown architecture; known: "
                                         + ", ".join(sorted(ARCHITECTURES))):
        ModelSpec(arch="mamba")


@pytest.mark.parametrize("arch, attention", model_cases())
def test_each_pair_holds_the_registered_core(arch, attention):
    """The core of every layer is the registry's: the native mixing where the architecture serves the attention
    name with its own, else the attention core of that name."""
    model = build_model(tiny_spec(arch, attention=attention))
    cores = [m.core for m in model.modules() if isinstance(getattr(m, "core", None), nn.Module)]
    native = native_mixing(arch, attention)
    expected = native.cls if native else ATTENTIONS[attention]
    assert len(cores) == model.spec.n_layers and all(type(c) is expected for c in cores)


def test_rwkv7_native_time_mixing_is_registered_under_its_own_name():
    mixing = NATIVE_MIXINGS["rwkv7"]
    assert mixing.arch == "rwkv7" and mixing.serves == ("linear",)  # arch=rwkv7 attention=linear, as configs say
    assert native_mixing("gpt2", "linear") is None  # GPT-2 runs the linear attention core
    with pytest.raises(ValueError, match="attention='linear' is already served"):
        register_native_mixing("other", arch="rwkv7", serves=("linear",))(nn.Module)
    assert set(NATIVE_MIXINGS) == {"rwkv7"}
