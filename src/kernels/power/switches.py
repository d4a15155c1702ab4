"""Kernel switches from the command line: 'FIELD=VALUE' items for the config objects of the power kernels, applied
as overrides for the calls inside a `with` block (nothing stays changed after it).

    with switches.applied(["outer_stages=3", "attention.offdiag_fp32_grads=1"], tiles={"fwd": (64, 32, 4, 3, 96)}):
        ...

FIELD is a field of one family's config (p2: chunk_p2.config.P2Config; attention, chunk, gates, dispatch:
longctx.kernels.power.config), optionally prefixed by the family where two share a name. VALUE: 0 / 1 for a
boolean, an integer, a comma list of integers for a tuple, or a word for a string. A bad item raises SwitchError
(a ValueError) naming it; command lines turn it into their one error line.
"""
from __future__ import annotations

import contextlib
import dataclasses

from . import config
from .chunk_p2 import config as p2_config

FAMILIES = {"p2": p2_config.slot, "attention": config.attention, "chunk": config.chunk, "gates": config.gates,
            "dispatch": config.dispatch}


class SwitchError(ValueError):
    """A switch item that names no field, or a value of the wrong type."""


def _fields(family: str) -> dict:
    return {f.name: f for f in dataclasses.fields(FAMILIES[family].current())}


def _value(current, text: str, item: str):
    try:
        if isinstance(current, bool):
            if text not in ("0", "1"):
                raise ValueError(text)
            return text == "1"
        if isinstance(current, tuple):
            return tuple(int(x) for x in text.split(","))
        if isinstance(current, int):
            return int(text)
        if isinstance(current, str):
            return text
    except ValueError:
        raise SwitchError(f"switch {item!r}: value {text!r} is not a {type(current).__name__}") from None
    raise SwitchError(f"switch {item!r}: a {type(current).__name__} field is not set from the command line")


def parse(items) -> dict[str, dict]:
    """['outer_stages=3', 'attention.offdiag_fp32_grads=1'] -> {family: {field: value}}; one clear error (SwitchError)
    for an item that names no field, or a field two families share without a prefix."""
    out: dict[str, dict] = {}
    for item in items:
        if "=" not in item:
            raise SwitchError(f"switch {item!r}: expected FIELD=VALUE")
        name, text = item.split("=", 1)
        family, _, field = name.rpartition(".")
        if family and family not in FAMILIES:
            raise SwitchError(f"switch {item!r}: no family {family!r}; families: {', '.join(FAMILIES)}")
        owners = [family] if family else [f for f in FAMILIES if field in _fields(f)]
        owners = [f for f in owners if field in _fields(f)]
        if not owners:
            raise SwitchError(f"switch {item!r}: no config ({', '.join(FAMILIES)}) has a field {field!r}")
        if len(owners) > 1:
            raise SwitchError(f"switch {item!r}: {field!r} is a field of {' and '.join(owners)}: prefix the family")
        current = getattr(FAMILIES[owners[0]].current(), field)
        out.setdefault(owners[0], {})[field] = _value(current, text, item)
    return out


@contextlib.contextmanager
def applied(items=(), tiles=None):
    """The switches `items` (parse) and the attention tiles `tiles` ({kernel: (BM, BN, warps, stages[, maxnreg])})
    as overrides inside the block."""
    changes = parse(items)
    if tiles:
        changes.setdefault("attention", {})["block_override"] = dict(tiles)
    with contextlib.ExitStack() as stack:
        for family, fields in changes.items():
            stack.enter_context(FAMILIES[family].override(**fields))
        yield changes
