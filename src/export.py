"""Export a trained run as a Hugging Face transformers folder.

    python -m longctx.export runs/gpt2_power_p2_d64l3_icl_markov_ctx128_s0 --out hf/power_p2

The folder loads with `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` (or, with longctx
imported, without remote code) and generates with transformers' `generate`, keeping longctx's decoding states. See
docs/evaluate.md (Hugging Face). A relative --out is taken from the current folder; the line printed names the
absolute path written. An --out that exists and is not an empty folder is refused: nothing is written over.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m longctx.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's directory (checkpoints/, config.yaml)")
    parser.add_argument("--out", required=True, help="the folder to write (must not exist, or be empty; a relative "
                        "path is taken from the current folder, and the absolute path written is printed)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from longctx.hf.export import export_run
        out = export_run(args.run_dir, args.out, step=args.step)
    except (ImportError, ValueError) as err:  # a missing extra, a bad run or --out: one line
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.run_dir} to {Path(out).absolute()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
