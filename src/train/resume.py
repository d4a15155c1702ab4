"""What a resumed run may change: the saved config (inside the checkpoint) against the new one, key by key.

Every changed key is either applied or refused by name:
- the schedule (optim.lr, optim.min_lr, optim.warmup_steps, trainer.max_steps, trainer.flops_budget): recomputed
  from the current step (optim.Schedule.resumed);
- the optimizer's other values (betas, eps, weight decay, gradient clipping): set on the loaded optimizer;
- how the run runs, not what it trains (evaluation and checkpoint cadence, precision, threads, compilation,
  context parallelism, logging, locations, the stop_when bound): taken as they are;
- anything else (the model, attention, data, ctx, seed, the optimizer's kind, ...) would make the checkpoint mean
  something else: refused; so is a trainer.init_from given only on the resume (the checkpoint's weights are what a
  resume continues: none would be loaded). One that moved (another path to the same weights) is taken.
A key only one side has (a config written before an option existed) is not compared.
"""
from __future__ import annotations

SCHEDULE_KEYS = ("optim.lr", "optim.min_lr", "optim.warmup_steps", "trainer.max_steps", "trainer.flops_budget")
OPTIMIZER_KEYS = ("optim.betas", "optim.eps", "optim.weight_decay", "optim.grad_clip")
RUNTIME_KEYS = ("run_name", "run_dir", "cache_dir", "device", "data.cache_dir", "data.path",
                "trainer.eval_every", "trainer.keep_checkpoints", "trainer.resume", "trainer.init_from",
                "trainer.num_threads", "trainer.compile", "trainer.activation_checkpointing", "trainer.micro_docs",
                "trainer.precision", "trainer.on_nonfinite", "trainer.max_skipped_steps", "trainer.icl_bins",
                "trainer.context_parallel", "trainer.stop_when", "attention.chunk_size")
RUNTIME_PREFIXES = ("logger.",)
UNREMARKABLE = ("trainer.resume", "run_dir", "run_name")  # differ between launches of one run by design
# The keys that say what the model is (a stage or a loaded checkpoint must keep them)
MODEL_GROUPS = ("model.", "arch.", "attention.")
MODEL_SHORTCUTS = ("p", "window")   # top-level keys the attention configs read


def _leaves(node, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_changes(saved: dict, now: dict) -> dict[str, tuple]:
    """key -> (saved value, new value) for every leaf both resolved configs have and that differs."""
    old, new = dict(_leaves(saved)), dict(_leaves(now))
    return {key: (old[key], new[key]) for key in new if key in old and old[key] != new[key]}


def classify(changes: dict[str, tuple]) -> tuple[dict, dict, dict]:
    """(schedule changes, other applied changes, refused changes)."""
    schedule = {k: v for k, v in changes.items() if k in SCHEDULE_KEYS}
    applied = {k: v for k, v in changes.items()
               if k in OPTIMIZER_KEYS or k in RUNTIME_KEYS or k.startswith(RUNTIME_PREFIXES)}
    if not changes.get("trainer.init_from", (True,))[0]:  # weights to start from, named only now: the checkpoint's
        applied.pop("trainer.init_from")                   # are what a resume continues, so none would be loaded
    refused = {k: v for k, v in changes.items() if k not in schedule and k not in applied}
    return schedule, applied, refused


def format_changes(changes: dict[str, tuple]) -> str:
    return "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items() if key not in UNREMARKABLE)


def refusal(run_dir, step: int, refused: dict[str, tuple]) -> str:
    return (f"trainer.resume: {run_dir} (step {step}) was trained with other values of keys a checkpoint cannot "
            f"change ({format_changes(refused)}); resume with the run's own values (its config.yaml), or start a "
            f"new run_name (trainer.init_from={run_dir} starts one from its weights). Nothing was written.")
