"""A trained run as a Hugging Face folder: `export_run(run_dir, out_dir)` (the CLI: `python -m longctx.export`).

The folder holds config.json (model_type "longctx": the run's ModelSpec as fields, and `auto_map` naming the two
remote-code files), model.safetensors (every weight once: a tied LM head is tied again when loaded),
configuration_longctx.py and modeling_longctx.py (two lines each: they import the installed longctx, which carries
the models and kernels), the run's tokenizer where its data has one, and README.md, a model card naming the run, its
data and its last evaluation. It is written into a fresh hidden folder beside `out_dir` and renamed into place, so
`out_dir` appears complete or not at all; an existing non-empty `out_dir` is never written over.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from longctx.hf.configuration import LongctxConfig, require

require("transformers", "safetensors", "tokenizers", what="longctx.export")

from safetensors.torch import save_file  # noqa: E402

from longctx.hf.modeling import tied_parameters  # noqa: E402
from longctx.runs import RunError, load_run  # noqa: E402

REMOTE_CONFIG = "configuration_longctx.py"
REMOTE_MODEL = "modeling_longctx.py"
AUTO_MAP = {"AutoConfig": "configuration_longctx.LongctxConfig",
            "AutoModelForCausalLM": "modeling_longctx.LongctxForCausalLM"}
# transformers copies these beside its module cache and checks their imports first: without longctx installed it
# stops naming the package to install
REMOTE_FILES = {
    REMOTE_CONFIG: '"""longctx\'s config class (pip install longctx: the models and kernels live in the package)."""\n'
                   "from longctx.hf.configuration import LongctxConfig  # noqa: F401\n",
    REMOTE_MODEL: '"""longctx\'s model class (pip install longctx: the models and kernels live in the package)."""\n'
                  "from longctx.hf.modeling import LongctxForCausalLM  # noqa: F401\n",
}


class ExportError(ValueError):
    """An export that cannot be made: the message names the path or value and why (one line)."""


def export_run(run_dir, out_dir, step: int | None = None) -> Path:
    """Write the run's model (its newest checkpoint, or `step`'s) as a transformers folder at `out_dir` -> out_dir.

    Raises ExportError (a ValueError, one line) for an `out_dir` that exists and is not an empty folder, and for a
    run without a readable checkpoint (longctx.runs.RunError's message)."""
    out = Path(out_dir).expanduser()
    if out.is_symlink() or out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out={str(out)!r} exists and is not an empty folder; nothing is ever written over: "
                          f"give a new path")
    try:
        model, cfg = load_run(run_dir, step=step, device="cpu")
    except RunError as err:
        raise ExportError(str(err)) from None
    run_dir = Path(run_dir).expanduser()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp", dir=out.parent))
    except OSError as err:
        raise ExportError(f"--out={str(out)!r}: its folder cannot be written ({err.strerror or err})") from None
    try:
        tokenizer_note, special = write_tokenizer(run_dir, cfg, tmp)
        config = LongctxConfig.from_spec(model.spec, auto_map=AUTO_MAP, architectures=["LongctxForCausalLM"],
                                         tie_word_embeddings=bool(tied_parameters(model)), **special)
        config.save_pretrained(tmp)
        write_weights(model, tmp / "model.safetensors")
        for name, text in REMOTE_FILES.items():
            (tmp / name).write_text(text)
        (tmp / "README.md").write_text(model_card(run_dir, out.name, model, cfg, tokenizer_note))
        share(tmp)
        try:
            if out.is_dir():
                out.rmdir()  # empty (checked above); a file appearing there since makes this fail, never lost
            os.rename(tmp, out)
        except OSError as err:
            raise ExportError(f"--out={str(out)!r}: could not be put in place ({err.strerror or err}); nothing "
                              f"was written there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def share(folder: Path) -> None:
    """The modes a folder made with the user's umask would have (mkdtemp makes it private, safetensors its file)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for path in folder.iterdir():
        os.chmod(path, 0o666 & ~mask)


def write_weights(model: torch.nn.Module, path: Path) -> None:
    """Every tensor of the model's state dict under "model.<name>", each tied parameter once (safetensors refuses
    shared storage; the loader ties them again)."""
    tied = tied_parameters(model)
    state = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items() if k not in tied}
    save_file(state, str(path), metadata={"format": "pt"})


# ----- tokenizer ---------------------------------------------------------------------------------------------

def byte_tokenizer():
    """longctx's byte tokenizer (UTF-8 bytes as ids 0..255, <|endoftext|> 256) as a transformers fast tokenizer:
    a byte-level BPE without merges, so each byte is its own token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from longctx.data.tokenizer import EOT

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 characters byte-level BPE writes bytes as
    char_of = {b: c for b, c in _bytes_to_unicode().items() if c in alphabet}
    vocab = {char_of[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the one byte-level BPE uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def run_tokenizer(run_dir: Path, cfg):
    """(a transformers tokenizer or None, a sentence for the card), by generate's rule (longctx.generate.run_codec):
    the prepared corpus's BPE the run keeps, else the tokenizer its data_identity.json records (bytes; GPT-2's where
    its files are on this machine; a BPE from its dataset only while the dataset holds ids of that one), else, for a
    run older than the record, its dataset's; None for data without text. A dataset re-prepared with another
    tokenizer since is said in a warning naming both, or refused (ExportError) where it was the only source."""
    from transformers import PreTrainedTokenizerFast

    from longctx.data.tokenizer import EOT
    from longctx.generate import dataset_tokens, recorded_tokens, warn_retokenized

    recorded = recorded_tokens(run_dir)  # an unreadable data_identity.json: None (a warning), as for a run without one
    current = dataset_tokens(cfg) if cfg is not None else None
    name = recorded_name(recorded, cfg)
    bpe = bpe_of(run_dir, name, cfg, recorded, current)
    warn_retokenized(cfg, recorded, current)
    if bpe is not None:
        bpe.tok.encode_special_tokens = False  # transformers' convention: the special token's text is the token
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe.tok, bos_token=EOT, eos_token=EOT)
        return tok, f"the run's byte-level BPE ({bpe.name}, from its prepared corpus)"
    if name is None:
        return None, f"none: the run's data ({cfg.data.name}) is token ids without text"
    if name == "bytes":
        return byte_tokenizer(), "UTF-8 bytes (ids 0..255, <|endoftext|> 256)"
    if name == "tiktoken-gpt2":
        from transformers import AutoTokenizer
        try:  # only from files already on this machine (the Hugging Face cache): an export never downloads
            tok = AutoTokenizer.from_pretrained("openai-community/gpt2", local_files_only=True)
        except (OSError, ValueError):
            return None, ("GPT-2's (tiktoken gpt2), not included: its files were not on the exporting machine; "
                          "use AutoTokenizer.from_pretrained('openai-community/gpt2')")
        return tok, "GPT-2's (openai-community/gpt2, the same ids as tiktoken's gpt2)"
    return None, f"{name}, not included: a file of the run's dataset, which was not on the exporting machine"


def recorded_name(recorded: dict | None, cfg) -> str | None:
    """The tokenizer the run's record names, read as generate reads it (`recorded_codec`: a record naming none is
    GPT-2's ids, or ids without text for generated data); for a run without a record, its dataset's."""
    from longctx.generate import recorded_tokenizer_name, tokenizer_name

    return tokenizer_name(cfg) if recorded is None else recorded_tokenizer_name(recorded)


def bpe_of(run_dir: Path, name: str | None, cfg, recorded: dict | None, current: dict | None):
    """The run's BPE tokenizer: the copy the run keeps, else its dataset's where the data is on this machine and
    still holds ids of the tokenizer the run recorded (ExportError naming both where it does not)."""
    from longctx.data.tokenizer import TOKENIZER_FILE, BPETokenizer, describe_tokens, tokens_differ

    kept = run_dir / TOKENIZER_FILE
    if kept.is_file():
        return BPETokenizer.from_file(kept)  # a damaged file: one line naming it
    path = cfg.data.get("path") if cfg is not None else None
    if not (name and name.startswith("bpe") and path and Path(str(path)).expanduser().is_dir()):
        return None
    if recorded is not None and current is not None and tokens_differ(recorded, current):
        raise ExportError(f"data.path={str(path)!r} now holds ids of {describe_tokens(current)}, but {run_dir} was "
                          f"trained on ids of {describe_tokens(recorded)} and keeps no {TOKENIZER_FILE} of its own: "
                          f"the run's tokenizer cannot be exported; put the run's {TOKENIZER_FILE} back in {run_dir}")
    from longctx.data import load_tokenizer
    found = load_tokenizer(Path(str(path)).expanduser())
    return found if isinstance(found, BPETokenizer) else None


def write_tokenizer(run_dir: Path, cfg, folder: Path) -> tuple[str, dict]:
    """Save the run's tokenizer into `folder` -> (the card's sentence, bos/eos ids for the config)."""
    tok, note = run_tokenizer(run_dir, cfg)
    if tok is None:
        print(f"tokenizer: {note}")
        return note, {}
    tok.save_pretrained(folder)
    return note, {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


# ----- model card --------------------------------------------------------------------------------------------

def last_evaluation(run_dir: Path, step: int | None = None) -> dict | None:
    """The last complete record of the run's metrics.jsonl, or with `step` the last record of that step (the
    checkpoint exported: an earlier step's weights carry that step's metrics); None without one."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a cut last line of a run still writing
        if isinstance(record, dict) and "step" in record and (step is None or record["step"] == step):
            last = record
    return last


def model_card(run_dir: Path, name: str, model, cfg, tokenizer_note: str) -> str:
    from longctx.data.identity import read_identity

    spec = model.spec
    try:
        identity = read_identity(run_dir)
    except ValueError as err:
        identity = {"unreadable": str(err)}
    step = getattr(model, "checkpoint_step", None)
    record = last_evaluation(run_dir, step)
    metrics = {k: v for k, v in (record or {}).items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    lines = [
        "---", "library_name: transformers", "tags: [longctx]", "---", "",
        f"# {name}", "",
        f"A longctx model exported from the run `{run_dir.name}` (checkpoint of step {model.checkpoint_step}): "
        f"{spec.arch} with {spec.attention} attention, {spec.n_layers} layers, d_model {spec.d_model}, "
        f"{spec.n_heads} heads, trained at context {spec.ctx}; {params:,} parameters.", "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        f'model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)  # needs: pip install longctx',
        "```", "",
        "The remote code imports the installed `longctx` package (it carries the models and kernels); with longctx "
        "imported (`import longctx.hf`) the folder also loads without `trust_remote_code`.", "",
        "## Model", "", "```json", json.dumps({k: getattr(spec, k) for k in spec.__dataclass_fields__}, indent=2),
        "```", "",
        "## Data", "",
        f"Dataset `{cfg.data.name}`; tokenizer: {tokenizer_note}.", "",
    ]
    if identity:
        lines += ["Data identity (data_identity.json):", "", "```json", json.dumps(identity, indent=2), "```", ""]
    lines += ["## Metrics", ""]
    if metrics:
        lines += [f"The run's evaluation of the exported step (metrics.jsonl, step {record['step']}):", "",
                  "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    else:
        lines.append(f"The run recorded no evaluation of step {step}." if step is not None
                     else "The run recorded no evaluation.")
    return "\n".join(lines) + "\n"
