"""The p=2 family of the chunked form: `forward` / `backward` are its one entry per direction (stages.py, composing
named stages), run where a call's plan names this family (plan.p2_family decides it). Kernels in Triton (kernels.py,
every GPU and the interpreter) and Gluon (gluon_outer.py, gluon_rows.py: Hopper, Triton >= 3.6); their tables and
tunables in config.py."""
from .stages import backward, forward

__all__ = ["forward", "backward"]
