"""Trainer, metrics, loggers and checkpoints. `run(cfg)` trains from a composed Hydra config."""
from longctx.train.metrics import bin_curve, exponential_bins, icl_summary, last_fraction_mean

__all__ = ["run", "bin_curve", "exponential_bins", "icl_summary", "last_fraction_mean"]


def run(cfg):
    """Train from a composed Hydra config (see conf/config.yaml); returns the last evaluation record."""
    from longctx.train.trainer import run as _run

    return _run(cfg)
