"""The attention registry: every core registers itself once, under the name its conf file carries.

A core is an `nn.Module` class with a `Params` dataclass: the attention's own parameters, which are exactly the
keys of `conf/attention/<name>.yaml` other than `name` and `tag` (CONF_ONLY_KEYS). `Params.__post_init__`
validates them with the checks below, so every bad value raises `AttentionParamError`
("attention.window=0: must be a positive integer") before a model is built.

    @register("window")
    class WindowAttention(nn.Module):
        @dataclass(frozen=True)
        class Params:
            window: int = 1024
            def __post_init__(self):
                positive_int(self, "window")

        def __init__(self, spec, params: Params): ...
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

ATTENTIONS: dict[str, type] = {}       # name -> core class; filled by @register as the modules are imported
CONF_ONLY_KEYS = ("name", "tag")       # keys of conf/attention/*.yaml that are not the core's parameters


class AttentionParamError(ValueError):
    """A bad attention parameter: `key` (without the `attention.` prefix), its `value`, and `why`."""

    def __init__(self, key: str, value, why: str):
        self.key, self.value, self.why = key, value, why
        super().__init__(f"attention.{key}={value!r}: {why}")


def register(name: str):
    """Class decorator: make a core available as `attention=<name>`. The class needs a `Params` dataclass."""
    def add(cls):
        if name in ATTENTIONS:
            raise ValueError(f"attention {name!r} is registered twice ({ATTENTIONS[name].__qualname__}, "
                             f"{cls.__qualname__})")
        if not dataclasses.is_dataclass(getattr(cls, "Params", None)):
            raise TypeError(f"{cls.__qualname__}: an attention core needs a `Params` dataclass")
        cls.name = name
        ATTENTIONS[name] = cls
        return cls
    return add


def attention_class(name: str) -> type:
    if name not in ATTENTIONS:
        raise AttentionParamError("name", name, f"unknown attention; known: {', '.join(sorted(ATTENTIONS))}")
    return ATTENTIONS[name]


def parse_params(name: str, params: Mapping | None = None):
    """The `Params` of attention `name` from a mapping (missing keys take their defaults); validated."""
    cls = attention_class(name)
    params = dict(params or {})
    known = [f.name for f in dataclasses.fields(cls.Params)]
    for key in params:
        if key not in known:
            raise AttentionParamError(key, params[key], f"not a parameter of attention={name} "
                                                        f"(its parameters: {', '.join(known) or 'none'})")
    return cls.Params(**params)


def params_from_conf(attention_cfg: Mapping) -> dict:
    """The core's parameters from an `attention` config node: every key but `name` and `tag`."""
    return {k: v for k, v in dict(attention_cfg).items() if k not in CONF_ONLY_KEYS}


# -- checks for Params.__post_init__: each raises AttentionParamError naming the key -----------------------

def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(params, key: str, allow_none: bool = False) -> None:
    value = getattr(params, key)
    if value is None and allow_none:
        return
    if not _is_int(value) or value < 1:
        raise AttentionParamError(key, value, "must be a positive integer" + (" or null" if allow_none else ""))


def int_in(params, key: str, low: int, high: int, why: str) -> None:
    value = getattr(params, key)
    if not _is_int(value) or not low <= value <= high:
        raise AttentionParamError(key, value, why)


def boolean(params, key: str) -> None:
    value = getattr(params, key)
    if not isinstance(value, bool):
        raise AttentionParamError(key, value, "must be true or false")
