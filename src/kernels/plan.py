"""Print the route a power_attention call takes (longctx.kernels.power.plan: form, family, launcher, chunk, and the
kernel and tile of each stage); --tunables also prints the rows of the tunables table (longctx.kernels.power.tunables)
its launches read:

    python -m longctx.kernels.plan t=65536 p=2 d=64                 # bf16 on CUDA unless dtype= / device= say else
    python -m longctx.kernels.plan t=4096 p=2 d=64 dtype=fp32 state_in=1
    python -m longctx.kernels.plan --tunables t=65536 p=2 d=64
    python -m longctx.kernels.plan --kernels                       # every kernel: name, compiled name, table rows
"""
import sys

from .power import kernel_index
from .power.plan import Plan, make_plan, plan_of

__all__ = ["Plan", "make_plan", "plan_of"]


def kernels_table() -> str:
    """One line per kernel_index kernel: its name, the compiled name profiles print, the tunables rows it reads."""
    lines = [f"{'kernel':22s} {'compiled (profiles)':24s} {'tunables rows':44s} what"]
    for name, k in kernel_index.INDEX.items():
        lines.append(f"{name:22s} {k.attr:24s} {', '.join(k.tiles):44s} {k.what}")
    return "\n".join(lines)


def main(argv) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv == ["--kernels"]:
        print(kernels_table())
        return 0
    rows = "--tunables" in argv
    try:
        plan = plan_of([a for a in argv if a != "--tunables"])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(plan.describe(rows=rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
