"""The p=2 family of the chunked form: `applies(p, d, dtype)` decides where it runs, `forward` / `backward` are its
one entry per direction (stages.py, composing named stages). Kernels in Triton (kernels.py, every GPU and the
interpreter) and Gluon (gluon_outer.py, gluon_rows.py: Hopper, Triton >= 3.6); their tables and tunables in
config.py."""
from .stages import applies, backward, forward

__all__ = ["applies", "forward", "backward"]
