"""longctx: long-context language-model research framework (power attention, ICL metrics)."""


def load_run(run_dir, step=None, device="auto"):
    """Load a trained run -> (model, cfg); see longctx.runs.load_run."""
    from longctx.runs import load_run as _load_run  # imported on use: `import longctx` stays light
    return _load_run(run_dir, step=step, device=device)


__all__ = ["load_run"]
