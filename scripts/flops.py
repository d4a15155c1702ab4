"""Weight and state FLOPs per token, and their ratio (WSFR), for a config given as train.py overrides.

    python scripts/flops.py arch=gpt2 model=small attention=exp ctx=1024

Prints a table; the last line is one JSON object with weight_flops_per_token, state_flops_per_token, wsfr and
wsfr_no_lm_head. WSFR is printed both ways, labelled: with the LM head's weight FLOPs (the model's full count, what
training records carry) and without them (as the paper's table appears to count, and README.md's WSFR table does).
The vocabulary is the data's, as the trainer's start-up estimate reads it (longctx.train.estimate.data_vocab):
icl_markov's `vocab + 1`, mqar's keys + values + 2, a prepared dataset's recorded one (`data.path`), else LongCrawl64's
GPT-2 50257, padded to 50304 as the trainer builds the model (longctx.models.spec.model_vocab_size): a vocabulary of
1024 or more is rounded up to a multiple of 64 so that the embedding and LM-head matmuls run whole tensor-core tiles
(nanoGPT's GPT-2 recipe pads 50257 the same way); the 47 extra ids are never data tokens, and their LM-head FLOPs are
counted, as training spends them.
Bad overrides are one line naming the key (`error: config: ...`), exit code 2, as train.py answers them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"


def main(overrides: list[str]) -> dict:
    import torch  # imported here: `--help` answers at once
    from hydra import compose, initialize_config_dir

    from longctx.models import build_model
    from longctx.train.config import validate
    from longctx.train.estimate import data_vocab
    from longctx.train.launch import check_overrides
    from longctx.train.flops import flops_report, format_ratio
    from longctx.train.trainer import model_spec, model_vocab_size

    check_overrides(list(overrides), CONF)  # a mistyped key or option: named, before Hydra composes
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["run_dir=unused", *overrides])
    validate(cfg)
    vocab = data_vocab(cfg)  # no token read or generated
    spec = model_spec(cfg, model_vocab_size(vocab))  # padded as the trainer pads it: GPT-2's 50257 -> 50304 (64 x 786)
    with torch.device("meta"):  # shapes only: no memory, no init time, even for large models
        model = build_model(spec)
    report = flops_report(model, cfg.ctx)
    # The paper's WSFR table appears to count weight FLOPs without the LM head (README's table does too): both.
    lm_head = 2.0 * spec.d_model * spec.vocab_size
    report["weight_flops_per_token_no_lm_head"] = report["weight_flops_per_token"] - lm_head
    report["wsfr_no_lm_head"] = report["weight_flops_per_token_no_lm_head"] / report["state_flops_per_token"]
    params = sum(p.numel() for p in model.parameters())
    rows = [("arch", spec.arch), ("attention", cfg.attention.tag), ("model", cfg.model.name),
            ("ctx", cfg.ctx), ("parameters", f"{params / 1e6:.1f}M"), ("vocab", spec.vocab_size),
            ("weight FLOPs/token (fwd)", f"{report['weight_flops_per_token']:.4g}"),
            ("state FLOPs/token (fwd)", f"{report['state_flops_per_token']:.4g}"),
            ("WSFR with the LM head (weight:state)", format_ratio(report["wsfr"])),
            ("WSFR without the LM head (README's table)", format_ratio(report["wsfr_no_lm_head"])),
            ("state size (floats, all layers)", f"{report['state_size']:.4g}"),
            ("train FLOPs/token (3x fwd)", f"{report['train_flops_per_token']:.4g}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    out = {"weight_flops_per_token": report["weight_flops_per_token"],
           "state_flops_per_token": report["state_flops_per_token"], "wsfr": report["wsfr"],
           "wsfr_no_lm_head": report["wsfr_no_lm_head"],
           "state_size": report["state_size"], "parameters": params}
    print(json.dumps(out))
    return out


def parse_args(argv: list[str]) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="train.py overrides (key=value), e.g. attention=power p=2 ctx=65536")
    return ap.parse_args(argv).overrides


if __name__ == "__main__":
    try:
        main(parse_args(sys.argv[1:]))
    except ValueError as err:  # a bad override or value: one line naming it, no traceback
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
