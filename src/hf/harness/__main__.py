"""python -m longctx.hf.harness RUN_OR_EXPORT --out TASK_DIR [--tasks heldout,passkey,needle,mqar] ...

Writes lm-eval-harness tasks made from the run's heldout data (or --text FILE) into TASK_DIR, a new folder; then
    lm_eval --model hf --model_args pretrained=EXPORT_DIR,trust_remote_code=True --tasks longctx_heldout \\
        --include_path TASK_DIR
runs them offline. Bad input gives one line `error: ...` and exit code 2; nothing is written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m longctx.hf.harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a run folder (its heldout data and tokenizer) or an exported model (with "
                                       "--text)")
    parser.add_argument("--out", required=True, help="the task folder to write (new, or empty)")
    parser.add_argument("--tasks", help="comma-separated: heldout, passkey, needle, mqar (default: heldout, passkey, "
                                        "needle; heldout, mqar for an MQAR run)")
    parser.add_argument("--text", help="a UTF-8 text file, cut into documents of --ctx tokens, instead of the run's "
                                       "heldout split")
    parser.add_argument("--ctx", type=int, help="document length in tokens (default: the run's ctx; the printed "
                                                "command's max_length fits the longest)")
    parser.add_argument("--docs", type=int, default=8, help="documents of heldout and mqar (default 8)")
    parser.add_argument("--bins", type=int, help="position bins of heldout (default: the run's trainer.icl_bins)")
    parser.add_argument("--contexts", help="passkey/needle prompt lengths, comma-separated (default: 1/4, 1/2 and "
                                           "all of ctx)")
    parser.add_argument("--depths", help="passkey/needle depths in [0, 1] (default 0,0.25,0.5,0.75,1)")
    parser.add_argument("--trials", type=int, default=20, help="prompts per context and depth (default 20)")
    parser.add_argument("--digits", type=int, default=5, help="symbols per key (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the keys (default 0)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    from longctx.evaluate import depth_list, int_list  # the same list syntax as evaluate's

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from longctx.hf.harness import generate

        summary = generate(args.source, args.out, args.tasks, text=args.text, ctx=args.ctx, docs=args.docs,
                           bins=args.bins, contexts=int_list("--contexts", args.contexts),
                           depths=depth_list(args.depths), trials=args.trials, digits=args.digits, seed=args.seed)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in summary["notes"]:
        print(line)
    tokenizer = f",tokenizer={summary['tokenizer']}" if summary["tokenizer"] else ""  # data without text: its ids
    exported = (Path(args.source) / "config.json").is_file() and not (Path(args.source) / "config.yaml").is_file()
    model = args.source if exported else "EXPORT_DIR"
    # max_length: the longest row's tokens and BOS (lm-eval cuts the left of longer prompts)
    print(f"wrote {summary['out']}; run: lm_eval --model hf --model_args pretrained={model},trust_remote_code=True,"
          f"max_length={summary['max_length']}{tokenizer} --tasks {','.join(summary['tasks'])} --include_path "
          f"{summary['out']}" + ("" if exported else f"  (EXPORT_DIR: python -m longctx.export {args.source} --out "
                                                      f"EXPORT_DIR)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
