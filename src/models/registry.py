"""The architecture registry: every architecture registers its model class once, under the name its conf file
(conf/arch/<name>.yaml) carries, as attention cores do (attention/registry.py).

    @register_architecture("gpt2")
    class GPT2(LanguageModelMixin, nn.Module):
        def __init__(self, spec: ModelSpec): ...

An architecture holds any attention core of the attention registry. One may also bring a native time mixing of
its own (RWKV-7's delta rule), registered under its own name with the attention names it serves on that
architecture (RWKV-7 reads `attention=linear` as its native rule):

    @register_native_mixing("rwkv7", arch="rwkv7", serves=("linear",))
    class RWKV7Rule(nn.Module): ...
"""
from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES: dict[str, type] = {}         # name -> model class; filled by @register_architecture at import


@dataclass(frozen=True)
class NativeMixing:
    name: str           # the mixing's own name
    arch: str           # the architecture it belongs to
    serves: tuple       # the attention names it stands for on that architecture
    cls: type


NATIVE_MIXINGS: dict[str, NativeMixing] = {}  # name -> native time mixing; filled by @register_native_mixing


def register_architecture(name: str):
    """Class decorator: make a model class available as `arch=<name>`; it is built as `cls(spec)`."""
    def add(cls):
        if name in ARCHITECTURES:
            raise ValueError(f"architecture {name!r} is registered twice ({ARCHITECTURES[name].__qualname__}, "
                             f"{cls.__qualname__})")
        cls.arch_name = name
        ARCHITECTURES[name] = cls
        return cls
    return add


def register_native_mixing(name: str, arch: str, serves: tuple[str, ...]):
    """Class decorator: architecture `arch`'s own time mixing, used there for each attention name in `serves`."""
    def add(cls):
        if name in NATIVE_MIXINGS:
            raise ValueError(f"native mixing {name!r} is registered twice")
        taken = [s for m in NATIVE_MIXINGS.values() if m.arch == arch for s in m.serves if s in serves]
        if taken:
            raise ValueError(f"{arch}: attention={taken[0]!r} is already served by another native mixing")
        NATIVE_MIXINGS[name] = NativeMixing(name, arch, tuple(serves), cls)
        return cls
    return add


def architecture_class(name: str) -> type:
    if name not in ARCHITECTURES:
        raise ValueError(f"arch={name!r}: unknown architecture; known: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[name]


def native_mixing(arch: str, attention: str) -> NativeMixing | None:
    """The native time mixing that architecture `arch` runs for `attention`, or None (the attention core itself)."""
    for mixing in NATIVE_MIXINGS.values():
        if mixing.arch == arch and attention in mixing.serves:
            return mixing
    return None
