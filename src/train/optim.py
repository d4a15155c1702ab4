"""AdamW with the paper's schedule: linear warmup, then cosine decay to a floor.

The schedule is torch's own schedulers (LinearLR, then CosineAnnealingLR, in a SequentialLR); `Schedule` is its
closed form, the truth they follow and the record a checkpoint keeps of it. A resumed run may change the schedule
(optim.lr, optim.min_lr, optim.warmup_steps, trainer.max_steps, or the step trainer.flops_budget stops at):
`Schedule.resumed` recomputes it from the current step and `build_scheduler` positions torch's schedulers there.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
from omegaconf import DictConfig

SCHEDULE_ATTR = "longctx_schedule"  # the Schedule, kept on the scheduler so its state_dict() carries it
WARMUP_FRACTION = 0.1  # a warmup longer than the run is scaled to this fraction of it (fitted_warmup)


def build_optimizer(model: torch.nn.Module, optim_cfg: DictConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (nanoGPT's convention: norms, biases and gains are not decayed)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": optim_cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim_cfg.lr, betas=tuple(optim_cfg.betas), eps=optim_cfg.eps)


def apply_hyperparameters(optimizer: torch.optim.Optimizer, optim_cfg: DictConfig) -> None:
    """Set betas, eps and weight decay from the config on an optimizer whose state was loaded from a checkpoint
    (load_state_dict restores the saved ones); the decayed group is the first (build_optimizer)."""
    for i, group in enumerate(optimizer.param_groups):
        group["betas"], group["eps"] = tuple(optim_cfg.betas), optim_cfg.eps
        group["weight_decay"] = optim_cfg.weight_decay if i == 0 else 0.0


def fitted_warmup(warmup_steps: int, run_steps: int) -> int:
    """The warmup a run of `run_steps` steps gets: optim.warmup_steps, or when that is longer than the run (whose lr
    would then never reach optim.lr), WARMUP_FRACTION of the run, at least 1 step. A function of the config alone, so
    that a resumed run recomputes the same warmup."""
    if warmup_steps <= run_steps:
        return warmup_steps
    return max(1, int(WARMUP_FRACTION * run_steps))


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup to `lr`, cosine to `min_lr` at max_steps."""
    return Schedule(lr, min_lr, warmup_steps, max_steps).lr_at(step)


@dataclass(frozen=True)
class Schedule:
    """Linear warmup to `lr` over `warmup_steps`, then a cosine to `min_lr` at `max_steps`, flat after it.

    cosine_peak: the top of the cosine when a resume re-fitted it to continue from the lr it had (None: `lr`).
    start: the step torch's schedulers were built at (0, or the step of the resume that changed the schedule).
    """
    lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int
    cosine_peak: float | None = None
    start: int = 0

    @classmethod
    def from_config(cls, optim_cfg: DictConfig, max_steps: int) -> "Schedule":
        """The config's schedule for a run ending at `max_steps`, its warmup fitted to the run (fitted_warmup)."""
        warmup = fitted_warmup(int(optim_cfg.warmup_steps), int(max_steps))
        return cls(float(optim_cfg.lr), float(optim_cfg.min_lr), warmup, int(max_steps))

    @property
    def cosine_steps(self) -> int:
        return max(1, self.max_steps - self.warmup_steps)

    def _cosine(self, step: int) -> float:
        """1 + cos(pi * progress): 2 at the end of the warmup, 0 at max_steps."""
        return 1.0 + math.cos(math.pi * min(1.0, (step - self.warmup_steps) / self.cosine_steps))

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        peak = self.lr if self.cosine_peak is None else self.cosine_peak
        return self.min_lr + 0.5 * (peak - self.min_lr) * self._cosine(step)

    def same_curve(self, other: "Schedule") -> bool:
        return (self.lr, self.min_lr, self.warmup_steps, self.max_steps) == (
            other.lr, other.min_lr, other.warmup_steps, other.max_steps)

    def resumed(self, step: int, new: "Schedule") -> "Schedule":
        """The schedule from `step` on when a resumed run asks for `new`'s values (self: the one trained so far).

        - nothing changed: self (the schedulers continue from their saved state);
        - `step` inside the new warmup: the new warmup as written, then its cosine from the new lr;
        - only lr/min_lr changed (same warmup and length): the new closed form (the lr's place on the cosine kept);
        - the length changed (max_steps, warmup, a flops budget) past the warmup: the cosine continues from where
          the lr stands, rescaled from the old [min_lr, lr] band to the new one, down to min_lr at the new end --
          never re-warmed (a finished run, at min_lr, stays there).
        """
        new = replace(new, cosine_peak=None, start=step)
        if self.same_curve(new):
            return self
        if step < new.warmup_steps or step < self.warmup_steps or self.lr <= self.min_lr:
            return new  # still warming up, or the old warmup was cut short: the new closed form
        if (new.warmup_steps, new.max_steps) == (self.warmup_steps, self.max_steps) and self.cosine_peak is None:
            return new
        place = (self.lr_at(step) - self.min_lr) / (self.lr - self.min_lr)   # 1 at the peak, 0 at the floor
        target = new.min_lr + place * (new.lr - new.min_lr)
        cosine = new._cosine(step)
        if cosine <= 0.0:
            return new  # at or past the new end: nothing left to train
        return replace(new, cosine_peak=new.min_lr + 2.0 * (target - new.min_lr) / cosine)

    def describe(self, step: int) -> str:
        """What the schedule does from `step` on, for the console."""
        if step >= self.max_steps:
            return f"lr {self.lr_at(step):.3g} (at the end of the schedule)"
        if step < self.warmup_steps:
            return (f"lr {self.lr_at(step):.3g} now, warming up to {self.lr:.3g} at step {self.warmup_steps}, then a "
                    f"cosine to {self.min_lr:.3g} at step {self.max_steps}")
        if self.lr_at(step) <= self.min_lr * (1 + 1e-9):
            return (f"lr stays at min_lr {self.min_lr:.3g} to step {self.max_steps} (its cosine had ended; no "
                    f"re-warming: a new run from these weights, trainer.init_from, warms up again)")
        return (f"lr {self.lr_at(step):.3g} now (no re-warming), a cosine to {self.min_lr:.3g} at step "
                f"{self.max_steps}")


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: Schedule, step: int = 0):
    """torch's schedulers for `schedule`, positioned at optimizer step `step` (0 for a new run): LinearLR over what
    is left of the warmup, then CosineAnnealingLR (a SequentialLR); past the warmup, the CosineAnnealingLR alone.
    They compute each lr from the previous one (torch's chainable form), so they start from the closed form's
    value at `step` and follow it. Build before loading the optimizer's state: building sets its lrs."""
    warmup, floor = schedule.warmup_steps, schedule.min_lr
    for group in optimizer.param_groups:
        group.pop("initial_lr", None)
    if step < warmup:
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr
        warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=(step + 1) / warmup, end_factor=1.0,
                                                 total_iters=warmup - 1 - step)
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=schedule.cosine_steps, eta_min=floor)
        scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[warmup - step])
    else:
        peak = schedule.lr if schedule.cosine_peak is None else schedule.cosine_peak
        for group in optimizer.param_groups:
            group["lr"], group["initial_lr"] = schedule.lr_at(step), peak
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=schedule.cosine_steps, eta_min=floor,
                                                               last_epoch=step - warmup - 1)
    setattr(scheduler, SCHEDULE_ATTR, asdict(schedule))
    return scheduler


def saved_schedule(scheduler_state: dict) -> Schedule | None:
    """The Schedule a checkpoint's scheduler state was built for (None: a checkpoint older than the record)."""
    fields = scheduler_state.get(SCHEDULE_ATTR)
    return Schedule(**fields) if fields else None
