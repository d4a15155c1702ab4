"""Every random number generator a run draws from (Python, numpy, torch CPU and CUDA): seeded once, saved in a
checkpoint as tensors and plain numbers (loadable with weights_only), so a resumed run draws what it would have."""
from __future__ import annotations

import random
from typing import Callable

import numpy as np
import torch

from longctx.train.distributed import DistInfo


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """This process's RNG states: Python's as its own tuple of ints, numpy's MT19937 keys as an int64 tensor."""
    algorithm, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"python": random.getstate(),
             "numpy": {"algorithm": algorithm, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def plain_rng_state(state: dict) -> dict:
    """A state as rng_state() gives it, from the older layout too (numpy's state as get_state()'s tuple)."""
    numpy_state = state.get("numpy")
    if isinstance(numpy_state, (tuple, list)):
        algorithm, keys, pos, has_gauss, cached = numpy_state
        numpy_state = {"algorithm": str(algorithm), "keys": torch.as_tensor(np.asarray(keys, dtype=np.int64)),
                       "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return {**state, "numpy": numpy_state}


def set_rng_state(state: dict) -> None:
    numpy_state = state["numpy"]
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state((numpy_state["algorithm"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RNGState:
    """Every rank's RNG states as one Stateful part: state_dict() gathers them to each rank (a collective: every
    rank calls it); load_state_dict() gives each rank its own (ranks beyond those saved reuse rank 0's)."""

    def __init__(self, dist: DistInfo, note: Callable[[str], None] | None = None):
        self.dist, self.note = dist, note

    def state_dict(self) -> dict:
        mine = rng_state()
        if not self.dist.enabled:
            return {"per_rank": [mine]}
        gathered = [None] * self.dist.world_size
        torch.distributed.all_gather_object(gathered, mine)
        return {"per_rank": gathered}

    def load_state_dict(self, state: dict) -> None:
        ranks = state["per_rank"]
        if not isinstance(ranks, list) or not ranks:
            raise ValueError(f"per_rank holds no rank's RNG state (a {type(ranks).__name__}: {str(ranks)[:40]})")
        if len(ranks) != self.dist.world_size and self.note is not None:
            self.note(f"note: checkpoint holds RNG states of {len(ranks)} ranks, this run has "
                      f"{self.dist.world_size}; ranks beyond them reuse rank 0's")
        set_rng_state(plain_rng_state(ranks[self.dist.rank] if self.dist.rank < len(ranks) else ranks[0]))
