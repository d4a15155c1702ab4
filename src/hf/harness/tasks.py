"""The task data: documents made offline from a run's own heldout split (or a local text file), decoded into the text
lm-eval reads, each task a JSON-lines file beside its YAML.

- heldout: the first `docs` heldout documents, each bin [a, b) of the ICL curve's position bins one lm-eval document
  whose two choices are the document's text up to a and up to b (the first bin: up to b only); lm-eval reads each
  after BOS, so ll(up to b) - ll(up to a) is the log-probability of the bin's tokens given all before them. Metrics:
  `nll` (mean per token, nats: longctx's heldout loss), `bits_per_byte`, and `nll_A_B` per bin (the ICL curve).
- passkey, needle: the prompts of `longctx.eval.retrieval` (the same ids as `python -m longctx.evaluate --task
  passkey --seed S` builds, same keys), the context everything before the final key, which the model generates
  greedily; metrics: `exact_match` and `acc_CTX_DEPTH` per cell.
- mqar: for each query of the first heldout documents of an MQAR run, the document up to the query's value; the
  value must be the argmax after its key (`acc`, and `acc_A_B` by distance bin, as longctx.eval.recall bins it).

Every text is checked to read back as exactly the ids it came from (`encode(decode(ids)) == ids`); a document that
does not (a cut through a multi-byte character) is passed over and counted. Contexts that do not start the model's
input at BOS start with the BOS token's text, which the tokenizer reads as the BOS id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longctx.eval.metrics import exponential_bins
from longctx.eval.recall import distance_edges
from longctx.eval.retrieval import Alphabet, alphabet_for, build_prompt, prompt_parts

TASKS = ("heldout", "passkey", "needle", "mqar")
TEMPLATES = Path(__file__).resolve().parent   # <task>.yaml: what every generated task of that kind shares
PREFIX = "longctx_"                           # lm-eval task names: longctx_heldout, longctx_passkey, ...


class Codec:
    """The text side of a transformers tokenizer: ids <-> text without special tokens added, and BOS."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        if tokenizer.bos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__}: has no BOS token; longctx models read every "
                             f"document after BOS")
        self.bos, self.bos_text = int(tokenizer.bos_token_id), str(tokenizer.bos_token)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], clean_up_tokenization_spaces=False)

    def text(self, ids) -> str | None:
        """The text of `ids`, or None when it does not read back as exactly these ids."""
        ids = [int(i) for i in ids]
        text = self.decode(ids)
        return text if self.encode(text) == ids else None

    def text_bytes(self, text: str) -> int:
        """The bytes of a text that text() gave, its BOS / end-of-text tokens counting none: their spelling reads
        back as the one token (a literal copy would not have read back as its ids), and is no text of the data."""
        return len(text.encode()) - text.count(self.bos_text) * len(self.bos_text.encode())


def id_tokenizer(vocab_size: int, bos: int):
    """Text for data without any (the ICL Markov states, MQAR): each id written as its decimal number, ids separated
    by a space, BOS as <|endoftext|>; a word-level transformers tokenizer that reads that text back as the ids (the
    task folder keeps it, and lm-eval is given it as `tokenizer=`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from longctx.data.tokenizer import EOT

    vocab = {str(i): i for i in range(vocab_size) if i != bos} | {EOT: bos}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOT))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([EOT])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT)


@dataclass
class TaskData:
    """One generated task: its lm-eval documents, the metrics its YAML lists, and what was passed over."""
    task: str
    rows: list[dict]
    metrics: list[str]
    skipped: int = 0
    extra: dict = field(default_factory=dict)   # YAML keys of this generation (generation_kwargs)
    notes: dict = field(default_factory=dict)   # the parameters, for the summary


# ----- heldout -------------------------------------------------------------------------------------------------
def heldout_task(codec: Codec, documents: np.ndarray, bins: int) -> TaskData:
    """Per-position loss of `documents` (n, T) in the ICL curve's `bins` exponential position bins."""
    n, ctx = documents.shape
    edges = exponential_bins(ctx, bins, key="--bins")
    rows, skipped = [], 0
    for i, doc in enumerate(documents):
        texts = {0: ""} | {b: codec.text(doc[:b]) for _, b in edges}
        if any(t is None for t in texts.values()):
            skipped += 1
            continue
        for a, b in edges:
            choices = [texts[b]] if a == 0 else [texts[a], texts[b]]
            rows.append({"doc": i, "start": a, "end": b, "cell": f"nll_{a}_{b}", "choices": choices,
                         "tokens": b - a, "bytes": codec.text_bytes(texts[b]) - codec.text_bytes(texts[a])})
    metrics = ["nll", "bits_per_byte"] + [f"nll_{a}_{b}" for a, b in edges]
    return TaskData("heldout", rows, metrics, skipped, notes={"docs": n - skipped, "ctx": ctx, "bins": edges})


# ----- passkey, needle -----------------------------------------------------------------------------------------
def text_alphabet(codec: Codec, vocab: int, ctx: int, seed: int) -> Alphabet:
    """longctx.eval.retrieval's word alphabet for this tokenizer: digits 0-9 as single tokens, its marker and
    filler; an id alphabet (a tokenizer without single-token digits) has no text lm-eval could read."""
    alphabet = alphabet_for(vocab, codec.bos, ctx, codec.encode, seed)
    if alphabet.digits != tuple(codec.encode(str(i))[0] for i in range(len(alphabet.digits))):
        raise ValueError(f"retrieval: the tokenizer ({type(codec.tokenizer).__name__}) does not spell the digits 0-9 "
                         f"as one token each; the passkey prompts need them")
    return alphabet


def retrieval_task(task: str, codec: Codec, alphabet: Alphabet, contexts: list[int], depths: list[float],
                   trials: int, digits: int, seed: int, documents: np.ndarray | None = None) -> TaskData:
    """The prompts `longctx.eval.retrieval.run_retrieval` scores with the same arguments (the keys drawn in the
    same order from `seed`): lm-eval generates `digits` tokens after each context, compared with the key."""
    rows, skipped, metrics = [], 0, ["exact_match"]
    for ctx, stacks, keys in prompt_parts(task, alphabet, contexts, depths, trials, digits, documents, seed):
        for i, depth in enumerate(depths):
            cell = f"acc_{ctx}_{depth:g}"
            metrics.append(cell)
            for t in range(trials):
                prompt = build_prompt(stacks[t], depth, alphabet, keys[i, t])
                context, target = codec.text(prompt[:-digits]), codec.decode(prompt[-digits:])
                if context is None:
                    skipped += 1
                    continue
                rows.append({"context": codec.bos_text + context, "target": target, "ctx": ctx, "depth": depth,
                             "trial": t, "cell": cell})
    extra = {"generation_kwargs": {"until": [], "max_gen_toks": digits, "do_sample": False, "temperature": 0.0}}
    return TaskData(task, rows, metrics, skipped, extra, {"contexts": contexts, "depths": depths, "trials": trials,
                                                          "digits": digits, "seed": seed})


# ----- mqar ----------------------------------------------------------------------------------------------------
def mqar_task(codec: Codec, documents: np.ndarray, queries: np.ndarray) -> TaskData:
    """One lm-eval document per query of `documents` (n, T): the text up to the query's value, the value as the
    continuation; `queries` (n, 2, Q) as heldout_batch gives them (value positions, distances)."""
    edges = distance_edges(int(queries[:, 1].max()))
    bins = list(zip(edges[:-1], edges[1:]))
    rows, skipped = [], 0
    for i, doc in enumerate(documents):
        for pos, dist in zip(queries[i, 0].tolist(), queries[i, 1].tolist()):
            # lm-eval reads context + target whole and scores the tokens past the context's: the value alone when
            # both texts read back as their ids and the context does not end in blanks (lm-eval moves those over)
            context, both = codec.text(doc[:pos]), codec.text(doc[:pos + 1])
            if context is None or both is None or not both.startswith(context) or context != context.rstrip():
                skipped += 1
                continue
            value = both[len(context):]
            a, b = next((a, b) for a, b in bins if a <= dist < b)
            rows.append({"context": codec.bos_text + context, "target": value, "doc": i, "distance": dist,
                         "cell": f"acc_{a}_{b}"})
    metrics = ["acc"] + [f"acc_{a}_{b}" for a, b in bins]
    return TaskData("mqar", rows, metrics, skipped, notes={"docs": len(documents), "queries": int(queries.shape[-1])})


# ----- the folder ----------------------------------------------------------------------------------------------
def write_task(data: TaskData, out: Path, source: str) -> Path:
    """out/longctx_<task>.jsonl and out/longctx_<task>.yaml (the shipped template + this data's file and metrics)."""
    name = PREFIX + data.task
    if not data.rows:
        raise ValueError(f"{name}: no document could be made ({data.skipped} passed over: their text does not read "
                         f"back as their ids)")
    rows = out / f"{name}.jsonl"
    with open(rows, "x") as f:
        for row in data.rows:
            f.write(json.dumps(row) + "\n")
    aggregation = {"bits_per_byte": "bits_per_byte"}
    default = "!function longctx.hf.harness.metrics." + ("token_nll" if data.task == "heldout" else "mean")
    lines = [(TEMPLATES / f"{data.task}.yaml").read_text().rstrip("\n"), "",
             f"# generated from {source}", f"task: {name}",
             "dataset_kwargs:", "  data_files:", f"    test: {json.dumps(str(rows.resolve()))}", "metric_list:"]
    for metric in data.metrics:
        lines += [f"  - metric: {metric}", f"    aggregation: {aggregation.get(metric, default)}",
                  f"    higher_is_better: {'false' if data.task == 'heldout' else 'true'}"]
    for key, value in data.extra.items():
        lines.append(f"{key}: {json.dumps(value)}")  # JSON is YAML
    path = out / f"{name}.yaml"
    with open(path, "x") as f:
        f.write("\n".join(lines) + "\n")
    return path


def check_out_folder(out: Path) -> None:
    """A folder that does not exist yet or is empty: nothing is written over."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out={str(out)!r}: exists and is not an empty folder; give a new one (nothing is ever "
                         f"written over)")


def summary_line(data: TaskData) -> str:
    """`longctx_<task>: N lm-eval documents ...` for the command line."""
    what = (f" ({data.notes['docs']} heldout documents x {len(data.notes['bins'])} position bins)"
            if data.task == "heldout" else "")
    skipped = (f", {data.skipped} passed over (their text does not read back as their ids)" if data.skipped
               else "")
    return f"{PREFIX}{data.task}: {len(data.rows)} lm-eval documents{what}{skipped}"


