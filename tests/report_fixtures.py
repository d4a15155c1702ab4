"""Run folders as the trainer writes them (config.yaml, metrics.jsonl, eval/step_*.npz), for the report's tests."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from longctx.train.metrics import icl_summary

N_DOCS = 64


def doc_noise(shape, seed: int) -> np.ndarray:
    """Per-document deviations with exactly zero mean over documents (the record's mean is then the curve)."""
    noise = np.random.default_rng(seed).normal(0, 0.3, size=shape)
    return noise - noise.mean(axis=0)


def fake_run(folder: Path, attention: str, ctx: int, offset: float, steps=(10, 20), npy: bool = False,
             init_from: str | None = None, seed: int = 0, change: dict | None = None, doc_bins: bool = False,
             doc_index=None, max_steps: int | None = None, drop: tuple = ()) -> Path:
    """A run directory: config.yaml + one metrics.jsonl record per evaluation, each summarised by the real
    icl_summary from a known per-position curve (the optimum 1 + 2/sqrt(t+1), shifted by `offset` and by
    0.5 / evaluation number); with doc_bins, each evaluation's per-document record too. The documents' own
    deviations depend on nothing but the documents, so runs on the same documents share them (as real runs do)."""
    folder.mkdir(parents=True)
    tag = {"power": "power_p2"}.get(attention, attention)
    cfg = OmegaConf.create({
        "ctx": ctx, "seed": seed, "arch": {"name": "gpt2"}, "attention": {"name": attention, "tag": tag},
        "model": {"name": "d256l4"}, "data": {"name": "icl_markov", "tag": "icl_markov", "docs_per_batch": 32,
                                              "reshape_block": None},
        "trainer": {"init_from": init_from, "max_steps": max_steps or steps[-1]},
        "run_name": f"{attention}_{folder.name}", "run_dir": str(folder)})
    cfg = OmegaConf.merge(cfg, change or {})
    for key in drop:  # an old config, written before the key existed
        group, name = key.split(".")
        del cfg[group][name]
    OmegaConf.save(cfg, folder / "config.yaml")
    vocab = int(OmegaConf.select(cfg, "data.vocab", default=4))
    bayes = 1.0 + 2.0 / np.sqrt(np.arange(ctx) + 1.0) + 0.01 * (vocab - 4)
    with open(folder / "metrics.jsonl", "w") as f:
        for i, step in enumerate(steps):
            curve = bayes + offset + 0.5 / (i + 1) + 0.001 * seed
            rec = {"step": step, "tokens": step * 1000, "flops": step * 1e12 * (2 if attention == "exp" else 1),
                   "train_loss": float(curve.mean()), "tokens_per_s": 12345.6 + i, "state_size": 1000 * ctx,
                   "wsfr": 0.25, **icl_summary(curve, 12, bayes)}
            if npy:
                (folder / "per_position_loss").mkdir(exist_ok=True)
                np.save(folder / "per_position_loss" / f"step_{step:08d}.npy", curve.astype(np.float32))
            else:
                rec["per_position_loss"] = [round(float(x), 5) for x in curve]
            if doc_bins:
                rec["doc_bins"] = write_doc_bins(folder, step, rec, seed, doc_index)
            f.write(json.dumps(rec) + "\n")
    return folder


def write_doc_bins(folder: Path, step: int, rec: dict, seed: int, doc_index=None) -> str:
    """eval/step_XXXXXXXX.npz whose document means are the record's icl_curve and bayes_curve; the documents'
    deviations are shared by every run (so paired differences are tight), plus a small one of the run's seed."""
    edges = np.array([[a, b] for a, b, _ in rec["icl_curve"]], np.int64)
    curve = np.array([v for *_, v in rec["icl_curve"]])
    bayes = np.array([v for *_, v in rec["bayes_curve"]])
    shared = doc_noise((N_DOCS, len(edges)), 1)
    own = 0.05 * doc_noise((N_DOCS, len(edges)), 100 + seed)
    rel = f"eval/step_{step:08d}.npz"
    (folder / "eval").mkdir(exist_ok=True)
    np.savez(folder / rel, loss=(curve + shared + own).astype(np.float32), edges=edges,
             bayes=(bayes + 0.5 * shared).astype(np.float32),
             doc_index=np.arange(N_DOCS, dtype=np.int64) if doc_index is None else np.asarray(doc_index))
    return rel
