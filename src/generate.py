"""Sample a continuation from a trained run.

    python -m longctx.generate RUN_DIR --prompt "The history of"
    python -m longctx.generate RUN_DIR --max-new-tokens 50 --prompt-ids 4,0,1,2 --temperature 0

Prints the continuation and the decoding speed: with `--prompt TEXT` as text, through the tokenizer the run recorded
(tiktoken GPT-2 for LongCrawl64, bytes for datasets prepared with the byte tokenizer, the BPE copy it keeps for a
prepared corpus), never its dataset's current one where that differs (said in a warning); with `--prompt-ids`
as ids (no tokenizer is loaded). Decoding uses the static decoder (preallocated states; on GPU the fast path: the
step compiled, power's state updated by its fused kernel, one CUDA graph per token: models/decoding.py);
`--no-compile` skips the compilation (seconds before the first token), `--no-static` takes the per-layer caches of
the eager path, `--no-cache` recomputes the whole prefix every token. Bad input gives one line `error: ...` and
exit code 2.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from longctx.data import dataset_info
from longctx.models import decoding
from longctx.models.decoding import compile_available, takes_fused_state
from longctx.runs import check_device, load_run
from longctx.train.estimate import available_memory
from longctx.train.console import setup_logging

log = logging.getLogger("longctx")


def tokenizer_name(cfg) -> str | None:
    """The tokenizer of the run's data: the arrays' `tokenizer` attribute; LongCrawl64's own arrays carry none
    and are GPT-2 ids; the ICL Markov data has no text at all (None)."""
    data = cfg.data
    if data.name == "icl_markov":
        return None
    name = None
    path = data.get("path")
    if path:
        try:
            name = dataset_info(Path(path).expanduser() / data.get("heldout_split", "heldout.zarr")).get("tokenizer")
        except (FileNotFoundError, ValueError, OSError):  # data not on this machine: fall back on the data's name
            name = None
    if name is None and data.name == "longcrawl64":
        name = "tiktoken-gpt2"
    return name


def codec(name: str | None):
    """(encode: str -> list[int], decode: list[int] -> str) of a tokenizer name, or None for ids without text."""
    if name == "tiktoken-gpt2":
        import tiktoken
        try:
            enc = tiktoken.get_encoding("gpt2")   # fetches the vocabulary the first time: may fail offline
        except Exception as err:  # noqa: BLE001 - network and cache errors of every kind: one line
            raise ValueError(f"--prompt: the run's tokenizer (tiktoken GPT-2) could not load its vocabulary "
                             f"({type(err).__name__}); set TIKTOKEN_CACHE_DIR to a tiktoken cache or give "
                             f"--prompt-ids") from None
        return enc.encode_ordinary, enc.decode
    if name == "bytes":
        return (lambda text: list(text.encode("utf-8")),
                lambda ids: bytes(i for i in ids if i < 256).decode("utf-8", errors="replace"))
    return None


_READ = object()   # run_codec / prompt_bos: read the run's record themselves


def run_codec(cfg, run_dir=None, recorded=_READ):
    """The run's text tokenizer as (encode, decode), or None where its data has no text (loaded only for --prompt),
    from what the run itself recorded first: the tokenizer file it keeps (a prepared corpus's BPE, copied into the
    run folder at launch); the tokenizer it recorded with its data (data_identity.json: bytes and GPT-2 load by
    name, a BPE from its dataset only while the dataset still holds that one); for a run that recorded none, the
    dataset's own where the data is on this machine (`longctx.data.load_tokenizer`, offline), else the one its data's
    name implies (LongCrawl64: GPT-2). A dataset re-prepared with another tokenizer since is said in a warning
    naming both, and never decodes. recorded: recorded_tokens(run_dir) where the caller has it (read once: a damaged
    record is said once)."""
    from longctx.data.tokenizer import TOKENIZER_FILE, BPETokenizer

    if cfg.data.name == "icl_markov":
        return None
    kept = Path(run_dir).expanduser() / TOKENIZER_FILE if run_dir is not None else None
    recorded = recorded_tokens(run_dir) if recorded is _READ else recorded
    current = dataset_tokens(cfg)
    if kept is not None and kept.is_file():
        tok = BPETokenizer.from_file(kept)  # a damaged file: one line naming it
        found = tok.encode, tok.decode
    elif recorded is not None:
        found = recorded_codec(cfg, recorded, current)
    else:
        found = dataset_codec(cfg)
    warn_retokenized(cfg, recorded, current)
    return found


def recorded_codec(cfg, recorded: dict, current: dict | None):
    """(encode, decode) of the tokenizer a run recorded (`recorded_tokens`), None for ids without text: bytes and
    GPT-2 by name; a BPE is a file of its dataset, used only while the dataset holds ids of that tokenizer."""
    from longctx.data.tokenizer import describe_tokens, tokens_differ

    name = recorded_tokenizer_name(recorded)
    if name is None:  # synthetic data: ids without text
        return None
    if name in ("bytes", "tiktoken-gpt2"):
        return codec(name)
    path = cfg.data.get("path")
    if current is None:
        raise ValueError(f"--prompt: the run's tokenizer {name} is a file of its dataset, data.path={str(path)!r}, "
                         f"which does not exist here; give --prompt-ids")
    if tokens_differ(recorded, current):
        raise ValueError(f"--prompt: the run was trained on ids of {describe_tokens(recorded)}, but its dataset, "
                         f"data.path={str(path)!r}, now holds ids of {describe_tokens(current)}; the run's tokenizer "
                         f"cannot be loaded: give --prompt-ids")
    return dataset_codec(cfg)


def prompt_bos(cfg, run_dir, recorded=_READ) -> int:
    """The BOS id the run's documents began with (the trainer's inputs[:, 0]): its record's; else the end-of-text of
    the BPE it keeps (a prepared corpus's BOS); else its dataset's; else the reader's default (GPT-2's end-of-text,
    LongCrawl64's)."""
    from longctx.data._array import GPT2_EOT
    from longctx.data.tokenizer import TOKENIZER_FILE, BPETokenizer

    recorded = recorded_tokens(run_dir) if recorded is _READ else recorded
    if recorded is not None and recorded.get("bos_id") is not None:
        return int(recorded["bos_id"])
    kept = Path(run_dir).expanduser() / TOKENIZER_FILE
    if kept.is_file():
        return int(BPETokenizer.from_file(kept).eot_id)
    current = dataset_tokens(cfg)
    return int(current["bos_id"]) if current is not None and current.get("bos_id") is not None else GPT2_EOT


def recorded_tokenizer_name(recorded: dict) -> str | None:
    """The tokenizer a run's record (`recorded_tokens`) names: one naming none holds GPT-2's ids (LongCrawl64's
    arrays record none), or ids without text (None) where the data was generated."""
    if recorded["tokenizer"] is None:
        return None if recorded["generator"] is not None else "tiktoken-gpt2"
    return recorded["tokenizer"]


def dataset_codec(cfg):
    """(encode, decode) of the tokenizer of the run's dataset as it is now (`load_tokenizer`, offline) where the data
    is on this machine, else of the one its data's name implies; for runs that recorded no tokenizer."""
    from longctx.data.tokenizer import NotText

    path = cfg.data.get("path")
    if path and Path(str(path)).expanduser().is_dir():
        from longctx.data import load_tokenizer
        try:
            tok = load_tokenizer(Path(str(path)).expanduser())
        except NotText:  # synthetic data: ids without text
            return None
        except RuntimeError as err:  # GPT-2's tiktoken vocabulary not on this machine: one line, with the way out
            raise ValueError(f"--prompt: {err}; or give --prompt-ids") from None
        return tok.encode, tok.decode
    if cfg.data.get("tag", cfg.data.name) != "longcrawl64":  # nothing says which tokenizer
        raise ValueError(f"--prompt: the run's dataset, data.path={str(path)!r}, does not exist here and the run "
                         f"records no tokenizer of its own; give --prompt-ids")
    return codec(tokenizer_name(cfg))


def warn_retokenized(cfg, recorded: dict | None, current: dict | None) -> None:
    """One warning line where the run's dataset now holds ids of another tokenizer than the run recorded: text
    decoded with the dataset's would not be what the model meant."""
    from longctx.data.identity import IDENTITY_FILE
    from longctx.data.tokenizer import describe_tokens, tokens_differ

    if recorded is not None and current is not None and tokens_differ(recorded, current):
        log.warning(f"data.path={str(cfg.data.get('path'))!r} now holds ids of {describe_tokens(current)}; the run "
                    f"was trained on ids of {describe_tokens(recorded)}, as its {IDENTITY_FILE} records: using the "
                    f"run's tokenizer")


def recorded_tokens(run_dir) -> dict | None:
    """What the ids of the run's training split meant at its first launch, as `split_tokens` gives them: the
    tokenizer and BOS of its record (data_identity.json), the tokenizer file the run keeps, its hash (recorded at
    launch, else the kept file's), and the data's `generator` (synthetic data); None for a run without a record."""
    from longctx.data.tokenizer import TOKENIZER_FILE, file_sha256

    train = recorded_train(run_dir)
    if train is None:
        return None
    attrs, kept = train.get("attrs", {}), Path(run_dir).expanduser() / TOKENIZER_FILE
    sha = train.get("tokenizer_sha256") or (file_sha256(kept) if kept.is_file() else None)
    return {"tokenizer": attrs.get("tokenizer"), "bos_id": attrs.get("bos_id"), "generator": attrs.get("generator"),
            "file": kept if kept.is_file() else None, "sha256": sha}


def dataset_tokens(cfg) -> dict | None:
    """`split_tokens` of the training split of the run's dataset as it is now, None where it is not on this machine
    (or not readable: the run's own record decides then)."""
    from longctx.data.tokenizer import split_tokens

    path = cfg.data.get("path")
    if not path:
        return None
    try:
        return split_tokens(Path(str(path)).expanduser() / cfg.data.get("train_split", "train.zarr"))
    except (FileNotFoundError, ValueError, OSError):
        return None


def recorded_train(run_dir) -> dict | None:
    """The record of the training split a run made with its data at its first launch (longctx.data.identity: its
    attrs, its BPE file's hash), None without a record (runs older than it) or with an unreadable one (said in a
    warning)."""
    if run_dir is None:
        return None
    from longctx.data.identity import read_identity

    try:
        record = read_identity(Path(run_dir).expanduser())
    except ValueError as err:  # a damaged record: decode as a run without one rather than refuse to read the run
        log.warning(f"{err}: the run's tokenizer is taken as if it recorded none")
        return None
    return None if record is None else record.get("train", {})


def parse_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; an empty item ('1,,2', a trailing comma) is refused: a dropped id would change the
    prompt unseen."""
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",")]
    except ValueError:
        raise ValueError(f"--prompt-ids={text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not ids:
        raise ValueError(f"--prompt-ids={text!r}: no ids")
    return ids


def generate_from_run(run_dir, max_new_tokens: int = 100, prompt: str | None = None, prompt_ids: str | None = None,
                      temperature: float = 1.0, top_k: int | None = None, use_cache: bool = True,
                      step: int | None = None, device: str = "auto", seed: int = 0, static: bool = True,
                      compile: bool | None = None) -> dict:
    """The continuation of a prompt (text or ids) by the run's model, with its decoding speed."""
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens={max_new_tokens}: must be a positive integer")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"--temperature={temperature}: must be a finite number >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"--top-k={top_k}: must be a positive integer (leave it out to sample from every token)")
    device = check_device(device, "--device")
    model, cfg = load_run(run_dir, step=step, device=device)
    vocab = model.spec.vocab_size
    recorded = recorded_tokens(run_dir) if prompt is not None else None
    text = run_codec(cfg, run_dir, recorded) if prompt is not None else None  # ids in, ids out: no tokenizer loaded
    if prompt is not None:
        if text is None:
            raise ValueError(f"--prompt: the run's data ({cfg.data.name}) has no tokenizer; give --prompt-ids")
        ids = text[0](prompt)
        if not ids:
            raise ValueError("--prompt: the text encodes to no tokens")
        ids = [prompt_bos(cfg, run_dir, recorded), *ids]   # after BOS, as every training document and evaluate's prompts
    else:
        ids = parse_ids(prompt_ids)
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise ValueError(f"--prompt-ids: id {bad[0]} is outside the model's vocabulary 0..{vocab - 1}")
    decoding.check_positions(model, len(ids), max_new_tokens, "--prompt" if prompt is not None else "--prompt-ids",
                             "--max-new-tokens")
    dev = next(model.parameters()).device
    check_decoding_memory(model, len(ids), max_new_tokens, dev)
    idx = torch.tensor([ids], device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with amp:
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache,
                             generator=gen, static=static, compile=compile)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = out[0, len(ids):].tolist()
    return {"prompt_ids": ids, "ids": new, "text": text[1](new) if text else None, "seconds": seconds,
            "tokens_per_s": len(new) / seconds, "step": model.checkpoint_step, "use_cache": use_cache,
            "decoder": decoder_name(use_cache, static, dev, compile, takes_fused_state(model))}


def check_decoding_memory(model, prompt_len: int, max_new_tokens: int, device: torch.device) -> None:
    """--max-new-tokens that cannot fit, refused before anything is allocated: the token buffers (the sequence and its
    copy) and the model's decoding state at the full length (an exp attention's KV cache grows with it; power's and
    RWKV-7's states do not), against the memory available on `device` (train/estimate.py's figure)."""
    total = prompt_len + max_new_tokens
    state_bytes = model.state_size(total) * (2 if device.type == "cuda" else 4)  # bf16 under CUDA autocast, else fp32
    need = 2 * 8 * total + state_bytes
    available = available_memory(device)
    if available is not None and need > available:
        raise ValueError(f"--max-new-tokens={max_new_tokens}: {prompt_len} + {max_new_tokens} tokens need about "
                         f"{need / 2 ** 30:.3g} GiB for the tokens and the model's decoding state, more than the "
                         f"{available / 2 ** 30:.3g} GiB available on {device}; ask for fewer tokens")


def decoder_name(use_cache: bool, static: bool, device: torch.device, compile: bool | None = None,
                 fused_state: bool = False) -> str:
    """The decoding path in words; compile None: the static decoder's default on `device` (compile_available);
    fused_state: the model keeps power states (`takes_fused_state`), which CUDA updates with the fused kernel."""
    if not use_cache:
        return "recomputing the prefix"
    if not static:
        return "cached decoding, eager"
    parts = ["cached decoding, static buffers"]
    if compile_available(device) if compile is None else compile:
        parts.append("compiled model step")                     # StaticDecoder's default compile_scope="model"
    if device.type == "cuda":
        parts += ["fused power kernel", "CUDA graphs"] if fused_state else ["CUDA graphs"]
    return ", ".join(parts)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m longctx.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run's directory (checkpoints/, config.yaml)")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="tokens to generate (default 100)")
    parser.add_argument("--prompt", help="prompt text (runs whose data has a tokenizer)")
    parser.add_argument("--prompt-ids", help="prompt token ids, comma-separated")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens only")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole prefix for every token")
    parser.add_argument("--no-static", action="store_true",
                        help="the eager cached path (caches replaced every token, no CUDA graphs)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the decoding step first (seconds before the first token, then faster tokens; "
                             "default: on GPU where torch.compile is available)")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the newest)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()  # warnings (a skipped checkpoint, ...) as `warning: ...` lines on stderr
    try:
        res = generate_from_run(args.run_dir, args.max_new_tokens, args.prompt, args.prompt_ids, args.temperature,
                                args.top_k, not args.no_cache, args.step, args.device, args.seed, not args.no_static,
                                args.compile)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)  # bad input: one line naming what is wrong, no traceback
        return 2
    try:
        print(res["text"] if res["text"] is not None else " ".join(str(i) for i in res["ids"]))
        print(f"{len(res['ids'])} tokens in {res['seconds']:.3f} s: {res['tokens_per_s']:.1f} tokens/s "
              f"({res['decoder']}, prompt of {len(res['prompt_ids'])} tokens, step {res['step']})")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (`| head`): no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
