"""Shared by the context-parallel tests on CPU: spawn a gloo world whose ranks each write a JSON of their results,
and run every case in every dtype with the power reference's EPS guard at 0 in float64 (exact truth there)."""
from __future__ import annotations

import json
from pathlib import Path

import torch.multiprocessing as mp

from longctx.kernels.power import reference


def run_cases(run_case, cases: dict, dtypes) -> dict:
    """{"<case>-<dtype>": run_case(case, dtype)} for every case and dtype; float64 runs without the EPS guard."""
    res = {}
    for name, case in cases.items():
        for dtype in dtypes:
            eps = reference.EPS
            reference.EPS = 0.0 if dtype == "float64" else eps
            try:
                res[f"{name}-{dtype}"] = run_case(case, dtype)
            finally:
                reference.EPS = eps
    return res


def write_rank(out, rank: int, res: dict) -> None:
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(res, f)


def spawn_ranks(worker, world: int, folder: Path) -> list[dict]:
    """worker(rank, world, rendezvous file, out folder) on `world` processes; each rank's JSON (write_rank), in order."""
    mp.spawn(worker, args=(world, str(folder / "rendezvous"), str(folder)), nprocs=world, join=True)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
