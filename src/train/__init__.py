"""Trainer, metrics, loggers and checkpoints. `run(cfg)` trains from a composed Hydra config.

Nothing here imports torch on `import longctx.train`: train.py's `--help` and config checks load
longctx.train.launch / config without it; the metrics load on first use."""

__all__ = ["run", "bin_curve", "exponential_bins", "icl_summary", "last_fraction_mean"]
_METRICS = ("bin_curve", "exponential_bins", "icl_summary", "last_fraction_mean")


def run(cfg):
    """Train from a composed Hydra config (see conf/config.yaml); returns the last evaluation record."""
    from longctx.train.trainer import run as _run

    return _run(cfg)


def __getattr__(name: str):
    if name in _METRICS:
        from longctx.train import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'longctx.train' has no attribute {name!r}")
