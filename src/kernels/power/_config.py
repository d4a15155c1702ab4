"""One frozen config object per kernel family, read at launch time, replaced for a while by `override`.

    with chunk_p2.config.override(outer_stages=3):     # A/B runs and tests
        y = power_attention(...)

Nothing flips module globals: a family's launch code asks `current()` once per launch, so an override covers exactly
the calls inside its `with` block (in this thread and any other running meanwhile: the kernels are process-wide).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Generic, TypeVar

Config = TypeVar("Config")


class ConfigSlot(Generic[Config]):
    """The current config of one kernel family and the defaults it was created with."""

    def __init__(self, default: Config):
        self.default = default
        self._current = default

    def current(self) -> Config:
        return self._current

    @contextlib.contextmanager
    def override(self, **changes):
        """The current config with `changes` (field=value) inside the block, restored after it. An unknown field
        raises TypeError naming it."""
        names = {f.name for f in dataclasses.fields(self._current)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"{type(self._current).__name__} has no field {unknown[0]!r}; fields: {sorted(names)}")
        saved = self._current
        self._current = dataclasses.replace(saved, **changes)
        try:
            yield self._current
        finally:
            self._current = saved
