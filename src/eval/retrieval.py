"""Retrieval evaluations: can the model read back a key hidden far back in its context?

Both tasks build prompts of exactly `ctx` tokens from token ids of the run's own vocabulary (never BOS):

    haystack[:d] + MARKER + KEY + haystack[d:] + MARKER + KEY
                   (the needle)                  (the question, then the scored key)

KEY is `digits` symbols drawn uniformly from an alphabet of `base` ids, MARKER a fixed sequence of ids, d the
needle's depth (a fraction of the haystack: 0 = its start, the farthest from the question, 1 = its end). The model
reads BOS + the prompt up to each key symbol of the final copy and its argmax prediction of that symbol is scored:
`digit_accuracy` is the share of symbols predicted right, `key_accuracy` the share of keys with every symbol right,
which is exactly the share of keys that greedy decoding after the final MARKER reproduces. `choice_accuracy` scores
a forced choice: the argmax among the alphabet's `base` symbols only, so a model that has not learned to answer
with a key symbol at all (a weak or early one, whose free argmax lies outside the alphabet) still shows whether it
reads the needle.

- passkey (Mohtashami & Jaggi, 2023): the haystack is a short filler pattern repeated;
- needle: the haystack is the start of a heldout document of the run's dataset (the corpus's own text); documents
  that contain MARKER are passed over.

Exact by construction: MARKER's first id never appears in the key alphabet or in the filler, and no other id of
MARKER is that id, so the needle's MARKER is its first occurrence in every prompt (a heldout haystack is checked).
A model that cannot see the needle predicts each key symbol independently of it, so its expected digit accuracy is
at most 1/base (`chance`), exactly 1/base when its predictions lie in the alphabet, and its expected choice accuracy
is exactly 1/base whatever it predicts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

from .loss import autocast, model_device

TASKS = ("passkey", "needle")
FILLER_TEXT = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
MARKER_TEXT = "\nThe pass key is: "
MAX_BASE = 10


@dataclass(frozen=True)
class Alphabet:
    """The ids a retrieval prompt is made of."""
    marker: tuple[int, ...]   # marker[0] occurs nowhere else: not in digits, filler, or the rest of the marker
    digits: tuple[int, ...]   # the key's symbols; base = len(digits)
    filler: tuple[int, ...]   # passkey's haystack: this pattern repeated
    bos: int

    @property
    def base(self) -> int:
        return len(self.digits)

    def check(self) -> None:
        lead = self.marker[0]
        if lead in self.digits or lead in self.filler or lead in self.marker[1:]:
            raise ValueError(f"retrieval alphabet: the marker's first id {lead} must occur nowhere else")
        if self.bos in self.digits or self.bos in self.marker or self.bos in self.filler:
            raise ValueError(f"retrieval alphabet: BOS id {self.bos} must not be used")
        if len(set(self.digits)) != len(self.digits) or len(self.digits) < 2:
            raise ValueError(f"retrieval alphabet: needs at least 2 distinct key symbols, got {self.digits}")


def alphabet_for(data_vocab: int, bos: int, ctx: int, encode: Callable[[str], list[int]] | None = None,
                 seed: int = 0) -> Alphabet:
    """The alphabet for a vocabulary of `data_vocab` ids (BOS `bos` excluded). With a tokenizer (`encode`), words:
    the digits 0-9, "The pass key is:" and a filler of plain sentences. Without one (the ICL Markov states), ids
    drawn once from `seed`: a lead id for the marker, up to 10 key symbols and a 31-id filler pattern from the
    other ids, and a marker long enough (base^(m-1) >> ctx) that a heldout haystack rarely holds it by chance."""
    if encode is not None:
        digits = [encode(str(i)) for i in range(MAX_BASE)]
        if all(len(d) == 1 for d in digits):
            text = Alphabet(marker=tuple(encode(MARKER_TEXT)), digits=tuple(d[0] for d in digits),
                            filler=tuple(encode(FILLER_TEXT)), bos=bos)
            try:
                text.check()
                return text
            except ValueError:
                pass  # a tokenizer whose pieces overlap: the id alphabet below
    usable = np.array([i for i in range(data_vocab) if i != bos], dtype=np.int64)
    if len(usable) < 3:
        raise ValueError(f"retrieval: the data's vocabulary ({data_vocab} ids, BOS {bos}) needs 3 ids besides BOS "
                         f"(a marker and two key symbols)")
    rng = np.random.default_rng(seed)
    lead = int(rng.choice(usable))
    rest = usable[usable != lead]
    digits = tuple(sorted(int(i) for i in rng.choice(rest, min(MAX_BASE, len(rest)), replace=False)))
    filler = tuple(int(i) for i in rng.choice(rest, 31))
    tail = max(3, math.ceil(math.log(1000 * max(ctx, 2)) / math.log(len(rest))))
    return Alphabet(marker=(lead, *(int(i) for i in rng.choice(rest, tail))), digits=digits, filler=filler, bos=bos)


def prompt_length(alphabet: Alphabet, digits: int) -> int:
    """The tokens a prompt spends on its two MARKER + KEY copies (the rest is haystack)."""
    return 2 * (len(alphabet.marker) + digits)


def contains(haystack: np.ndarray, pattern: tuple[int, ...]) -> bool:
    """Whether `pattern` occurs in the 1-d array `haystack`."""
    m = len(pattern)
    if len(haystack) < m:
        return False
    windows = np.lib.stride_tricks.sliding_window_view(haystack, m)
    return bool((windows == np.asarray(pattern)).all(1).any())


def build_prompt(haystack: np.ndarray, depth: float, alphabet: Alphabet, key: np.ndarray) -> np.ndarray:
    """haystack[:d] + MARKER + KEY + haystack[d:] + MARKER + KEY, d = round(depth * len(haystack)) -> int64."""
    marker = np.asarray(alphabet.marker, dtype=np.int64)
    d = int(round(depth * len(haystack)))
    return np.concatenate([haystack[:d], marker, key, haystack[d:], marker, key]).astype(np.int64)


def haystacks(task: str, alphabet: Alphabet, length: int, trials: int, documents: np.ndarray | None) -> np.ndarray:
    """(trials, length) haystacks: the filler repeated (passkey), or the starts of the heldout `documents` (n, L)
    that do not contain the marker (needle), the same documents at every depth and context."""
    if task == "passkey":
        pattern = np.asarray(alphabet.filler, dtype=np.int64)
        row = np.tile(pattern, -(-length // len(pattern)))[:length]
        return np.repeat(row[None], trials, 0)
    if task != "needle":
        raise ValueError(f"--task={task!r}: expected one of {', '.join(TASKS)}")
    if documents is None or documents.shape[1] < length:
        raise ValueError(f"needle: haystacks of {length} tokens need heldout documents at least that long")
    found = [doc[:length] for doc in documents if not contains(doc[:length], alphabet.marker)]
    if len(found) < trials:
        marked = len(documents) - len(found)
        why = f"{marked} of them hold{'s' if marked == 1 else ''} the marker" if marked else "the split has no more"
        raise ValueError(f"--trials={trials}: only {len(found)} of the {len(documents)} heldout documents read "
                         f"serve as haystacks ({why}); use fewer trials")
    return np.stack(found[:trials]).astype(np.int64)


class Scores(NamedTuple):
    """Per key symbol of each prompt (P, digits) bool: the free argmax over the vocabulary was right (`free`), the
    argmax among the key alphabet's symbols was right (`forced`)."""
    free: torch.Tensor
    forced: torch.Tensor


@torch.no_grad()
def score_prompts(model, prompts: torch.Tensor, digits: int, bos: int, micro_docs: int, choices: tuple[int, ...],
                  precision: str = "auto") -> Scores:
    """Whether the model's argmax predicts each of the last `digits` tokens of prompts (P, T), reading BOS and the
    prompt before it, over the whole vocabulary and among `choices` (the key's alphabet) only. One causal forward
    over BOS + prompt[:-1] scores every key symbol (the logits at a position see only the tokens before it), and
    every forward of a context has the same length."""
    device = model_device(model)
    P, T = prompts.shape
    free = torch.zeros(P, digits, dtype=torch.bool)
    forced = torch.zeros(P, digits, dtype=torch.bool)
    symbols = torch.tensor(choices, dtype=torch.long)
    with_bos = torch.cat([torch.full((P, 1), bos, dtype=torch.long), prompts], 1)  # (P, T + 1)
    for s in range(0, P, micro_docs):
        rows = with_bos[s:s + micro_docs].to(device)
        with autocast(device, precision):
            logits = model(rows[:, :T], last_only=digits)   # (b, digits, vocab): predictions of the key symbols
        logits, answer = logits.float().cpu(), rows[:, T - digits + 1:].cpu()
        free[s:s + micro_docs] = logits.argmax(-1) == answer
        forced[s:s + micro_docs] = symbols[logits[..., symbols].argmax(-1)] == answer
    return Scores(free, forced)


def prompt_parts(task: str, alphabet: Alphabet, contexts: list[int], depths: list[float], trials: int, digits: int,
                 documents: np.ndarray | None = None, seed: int = 0):
    """Per context: (ctx, the trials' haystacks, keys (len(depths), trials, digits)), the keys drawn in this order
    from `seed`: what every scorer of these prompts (run_retrieval, the lm-eval harness) builds them from."""
    alphabet.check()
    rng = np.random.default_rng(seed)
    for ctx in contexts:
        length = ctx - prompt_length(alphabet, digits)
        if length < 1:
            raise ValueError(f"--contexts: {ctx} leaves no haystack beside two copies of marker "
                             f"({len(alphabet.marker)} tokens) + key ({digits}); use contexts above "
                             f"{prompt_length(alphabet, digits)}")
        stacks = haystacks(task, alphabet, length, trials, documents)
        yield ctx, stacks, rng.choice(np.asarray(alphabet.digits), size=(len(depths), trials, digits))


def run_retrieval(model, task: str, alphabet: Alphabet, contexts: list[int], depths: list[float], trials: int,
                  digits: int, micro_docs: int, precision: str = "auto", documents: np.ndarray | None = None,
                  seed: int = 0, on_context: Callable[[int], None] | None = None) -> dict:
    """Accuracy of `model` at every context and depth over `trials` prompts each -> the JSON record's numbers:
    key_accuracy and digit_accuracy as [context][depth] lists, their means, and the chance levels."""
    key_acc, digit_acc, choice_acc = [], [], []
    for ctx, stacks, keys in prompt_parts(task, alphabet, contexts, depths, trials, digits, documents, seed):
        prompts = torch.from_numpy(np.stack([build_prompt(stacks[t], depth, alphabet, keys[i, t])
                                             for i, depth in enumerate(depths) for t in range(trials)]))
        scores = score_prompts(model, prompts, digits, alphabet.bos, micro_docs, alphabet.digits, precision)
        correct = scores.free.view(len(depths), trials, digits).double()
        key_acc.append(correct.all(-1).double().mean(1).tolist())
        digit_acc.append(correct.mean((1, 2)).tolist())
        choice_acc.append(scores.forced.view(len(depths), trials, digits).double().mean((1, 2)).tolist())
        if on_context is not None:
            on_context(ctx)
    return {"task": task, "contexts": list(contexts), "depths": list(depths), "trials": trials, "digits": digits,
            "base": alphabet.base, "marker": list(alphabet.marker), "alphabet": list(alphabet.digits),
            "chance": {"digit": 1 / alphabet.base, "key": alphabet.base ** -digits, "choice": 1 / alphabet.base},
            "key_accuracy": key_acc, "digit_accuracy": digit_acc, "choice_accuracy": choice_acc,
            "mean_key_accuracy": float(np.mean(key_acc)), "mean_digit_accuracy": float(np.mean(digit_acc)),
            "mean_choice_accuracy": float(np.mean(choice_acc))}
