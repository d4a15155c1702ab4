"""longctx: long-context language-model research framework (power attention, ICL metrics)."""
import warnings

# FLA says so at import on every machine without a GPU; CPU runs are expected to use the PyTorch reference.
# Set here so that every entry point (train.py, evaluate, generate, report) stays quiet.
warnings.filterwarnings("ignore", message="Triton is not supported on current platform", module=r"fla\.")


from longctx.naming import register as _register_run_name  # noqa: E402

from longctx.state import register as _register_state  # noqa: E402

_register_run_name()  # conf/config.yaml's run_name is ${longctx.run_name:}
_register_state()  # experiment configs' equal-state windows: ${longctx.equal_state_window:p,head_dim}


def _register_mqar_dense_ctx() -> None:
    """`${longctx.mqar_dense_ctx:n_pairs,n_queries,ctx}` in configs (the recall recipe's first stage); the data module
    is imported on use, so `import longctx` stays light."""
    from omegaconf import OmegaConf

    def dense_ctx(n_pairs, n_queries=None, ctx=None):
        from longctx.data.mqar import dense_ctx as _dense_ctx
        return _dense_ctx(n_pairs, n_queries, ctx)

    if not OmegaConf.has_resolver("longctx.mqar_dense_ctx"):
        OmegaConf.register_new_resolver("longctx.mqar_dense_ctx", dense_ctx)


_register_mqar_dense_ctx()


def load_run(run_dir, step=None, device="auto"):
    """Load a trained run -> (model, cfg); see longctx.runs.load_run."""
    from longctx.runs import load_run as _load_run  # imported on use: `import longctx` stays light
    return _load_run(run_dir, step=step, device=device)


__all__ = ["load_run"]
