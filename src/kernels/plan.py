"""Print the route a power_attention call takes (longctx.kernels.power.plan: form, family, launcher, chunk, and the
kernel and tile of each stage); --tunables also prints the rows of the tunables table (longctx.kernels.power.tunables)
its launches read:

    python -m longctx.kernels.plan t=65536 p=2 d=64                 # bf16 on CUDA unless dtype= / device= say else
    python -m longctx.kernels.plan t=4096 p=2 d=64 dtype=fp32 state_in=1
    python -m longctx.kernels.plan --tunables t=65536 p=2 d=64
"""
import sys

from .power.plan import Plan, make_plan, plan_of

__all__ = ["Plan", "make_plan", "plan_of"]


def main(argv) -> int:
    if not argv or {"-h", "--help"} & set(argv):
        print(__doc__.strip())
        return 0 if argv else 2
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
