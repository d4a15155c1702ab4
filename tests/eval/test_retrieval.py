"""Retrieval evaluations judged by references whose score is known: a module that copies the key found after the
marker scores 100% at every context and depth; the same module limited to a window that cannot reach the needle
scores the closed-form chance level 1/base per key symbol. Both are real nn.Modules with the models' interface
(forward(input_ids, targets=None, cache=None, last_only=False, reduction="none"))."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from longctx.eval.retrieval import (Alphabet, alphabet_for, build_prompt, contains, haystacks, prompt_length,
                                    run_retrieval, score_prompts)


class CopyAfterMarker(nn.Module):
    """At each position: if the newest `marker` occurrence visible is a question (an earlier occurrence is visible
    too), predict the token standing at the same offset after the earliest visible occurrence; otherwise `guess`.
    `window`: the model sees only its last `window` tokens (None: all of them)."""

    def __init__(self, vocab_size: int, marker, guess: int, window: int | None = None):
        super().__init__()
        self.marker, self.guess, self.window = list(marker), guess, window
        self.spec = SimpleNamespace(vocab_size=vocab_size)
        self.register_buffer("scale", torch.ones(()))  # where the module lives (it has no weights)

    def predict(self, row: list[int], i: int) -> int:
        lo = 0 if self.window is None else max(0, i - self.window + 1)
        seen, m = row[lo:i + 1], len(self.marker)
        starts = [s for s in range(len(seen) - m + 1) if seen[s:s + m] == self.marker]
        if len(starts) < 2:
            return self.guess
        offset = len(seen) - 1 - (starts[-1] + m - 1)         # 0 at the question's last marker token
        source = starts[0] + m + offset
        return seen[source] if source < starts[-1] else self.guess

    def forward(self, input_ids, targets=None, cache=None, last_only=False, reduction="none"):
        b, t = input_ids.shape
        positions = range(t - int(last_only), t) if last_only else range(t)
        logits = torch.zeros(b, len(positions), self.spec.vocab_size, device=input_ids.device)
        for r, row in enumerate(input_ids.tolist()):
            for k, i in enumerate(positions):
                logits[r, k, self.predict(row, i)] = 10.0 * self.scale
        if targets is None:
            return logits
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return nll.sum() if reduction == "sum" else nll


VOCAB, BOS = 12, 11          # ids 0..10 and BOS 11: a marker lead, up to 10 key symbols from the other 10 ids


def alphabet(ctx=256):
    return alphabet_for(VOCAB, BOS, ctx, seed=3)


def documents(n=64, length=256, seed=0):
    return np.random.default_rng(seed).integers(0, BOS, size=(n, length))


def test_id_alphabet_never_uses_bos_and_its_marker_lead_is_unique():
    a = alphabet()
    a.check()
    assert a.base == 10 and BOS not in a.digits + a.marker + a.filler
    assert a.marker[0] not in a.digits + a.filler + a.marker[1:]
    assert len(a.marker) - 1 >= math.log(1000 * 256) / math.log(10)   # rarely in a random haystack by chance
    tiny = alphabet_for(5, 4, 64)                                       # the default ICL Markov data: 4 states
    assert tiny.base == 3 and 4 not in tiny.digits + tiny.marker


def test_text_alphabet_with_a_tokenizer():
    a = alphabet_for(257, 256, 1024, encode=lambda text: list(text.encode()))   # the byte tokenizer
    assert a.digits == tuple(range(48, 58)) and bytes(a.marker).decode() == "\nThe pass key is: "
    assert bytes(a.filler).decode().startswith(" The grass is green.")
    prompt = build_prompt(haystacks("passkey", a, 120, 1, None)[0], 0.5, a, np.array([55, 49, 52, 51, 50]))
    text = bytes(prompt.tolist()).decode()
    assert text.count("\nThe pass key is: 71432") == 2 and text.endswith("\nThe pass key is: 71432")
    assert text.index("\nThe pass key is: ") == 60 and "green. The sky" in text


def test_prompt_puts_the_needle_at_its_depth_and_its_marker_first():
    a = alphabet()
    key = np.array(a.digits[:5])
    hay = np.asarray(haystacks("passkey", a, 100, 1, None)[0])
    for depth, at in ((0.0, 0), (0.5, 50), (1.0, 100)):
        p = build_prompt(hay, depth, a, key)
        assert len(p) == 100 + prompt_length(a, 5)
        starts = [s for s in range(len(p)) if tuple(p[s:s + len(a.marker)]) == a.marker]
        assert starts == [at, len(p) - 5 - len(a.marker)]
        assert p[at + len(a.marker):at + len(a.marker) + 5].tolist() == key.tolist() == p[-5:].tolist()


def test_needle_haystacks_pass_over_documents_holding_the_marker():
    a = alphabet()
    docs = documents(6)
    docs[1, 40:40 + len(a.marker)] = a.marker
    picked = haystacks("needle", a, 200, 5, docs)
    assert picked.tolist() == docs[[0, 2, 3, 4, 5], :200].tolist()
    assert not any(contains(h, a.marker) for h in picked)
    with pytest.raises(ValueError, match=r"--trials=6: only 5 of the 6 heldout documents read serve as haystacks "
                                         r"\(1 of them holds the marker\)"):
        haystacks("needle", a, 200, 6, docs)
    with pytest.raises(ValueError, match=r"only 1 of the 1 heldout documents read serve as haystacks \(the split has "
                                         r"no more\)"):
        haystacks("needle", a, 200, 2, docs[[0]])    # a split of one document: none holds the marker


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_a_model_that_reads_the_key_scores_every_prompt(task):
    a = alphabet()
    reader = CopyAfterMarker(VOCAB, a.marker, guess=a.digits[0])
    rec = run_retrieval(reader, task, a, [80, 200], [0.0, 0.3, 1.0], trials=6, digits=4, micro_docs=5,
                        documents=documents() if task == "needle" else None)
    assert rec["key_accuracy"] == rec["digit_accuracy"] == rec["choice_accuracy"] == [[1.0] * 3] * 2
    assert rec["mean_key_accuracy"] == rec["mean_choice_accuracy"] == 1.0
    assert rec["chance"] == {"digit": 0.1, "key": 1e-4, "choice": 0.1}


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_a_model_that_cannot_see_the_needle_scores_chance(task):
    """The window covers the question and the key so far, never the needle: each symbol is right with probability
    exactly 1/base (the key's symbols are uniform and independent of all it sees)."""
    a = alphabet()
    digits = 5
    blind = CopyAfterMarker(VOCAB, a.marker, guess=a.digits[0], window=len(a.marker) + digits)
    contexts, depths, trials = [96, 200], [0.0, 0.25, 0.5, 0.75, 1.0], 40
    rec = run_retrieval(blind, task, a, contexts, depths, trials=trials, digits=digits, micro_docs=16,
                        documents=documents() if task == "needle" else None, seed=1)
    symbols = len(contexts) * len(depths) * trials * digits
    p = 1 / a.base
    assert abs(rec["mean_digit_accuracy"] - p) < 5 * math.sqrt(p * (1 - p) / symbols)
    keys = len(contexts) * len(depths) * trials
    assert rec["mean_key_accuracy"] * keys <= 2     # expected keys right: 400 x 1e-5
    assert rec["mean_choice_accuracy"] == rec["mean_digit_accuracy"]   # its guesses lie in the alphabet


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_forced_choice_is_at_chance_for_a_blind_model_that_answers_outside_the_alphabet(task):
    """A model that cannot see the needle and answers with an id outside the key alphabet: its free digit accuracy is
    exactly 0, and its forced choice (the argmax among the alphabet's symbols) is right with probability exactly
    1/base, whatever it predicts."""
    a = alphabet()
    outside = next(i for i in range(VOCAB) if i not in a.digits and i != BOS)
    digits, contexts, depths, trials = 5, [96, 200], [0.0, 0.5, 1.0], 40
    blind = CopyAfterMarker(VOCAB, a.marker, guess=outside, window=len(a.marker) + digits)
    rec = run_retrieval(blind, task, a, contexts, depths, trials=trials, digits=digits, micro_docs=16,
                        documents=documents() if task == "needle" else None, seed=2)
    assert rec["mean_digit_accuracy"] == rec["mean_key_accuracy"] == 0.0
    symbols, p = len(contexts) * len(depths) * trials * digits, 1 / a.base
    assert abs(rec["mean_choice_accuracy"] - p) < 5 * math.sqrt(p * (1 - p) / symbols)


def test_forced_choice_credits_a_reader_whose_top_token_lies_outside_the_alphabet():
    """The reader ranks an outside id first and the needle's symbol second: every free prediction is wrong, every
    forced choice right."""
    a = alphabet()
    outside = next(i for i in range(VOCAB) if i not in a.digits and i != BOS)

    class SecondBest(CopyAfterMarker):
        def forward(self, input_ids, targets=None, cache=None, last_only=False, reduction="none"):
            logits = super().forward(input_ids, last_only=last_only)
            logits[..., outside] = 20.0
            return logits

    reader = SecondBest(VOCAB, a.marker, guess=a.digits[0])
    rec = run_retrieval(reader, "passkey", a, [80], [0.0, 1.0], trials=4, digits=4, micro_docs=4)
    assert rec["digit_accuracy"] == [[0.0, 0.0]] and rec["choice_accuracy"] == [[1.0, 1.0]]


def test_scoring_reads_only_what_comes_before_each_symbol():
    """The score of symbol j never sees symbol j: a module that predicts the token at the current position +1 would
    score 100% if it could; a model fed only the prefix predicts it from the prefix (here: the guess)."""
    a = alphabet()
    key = np.array(a.digits[1:6])
    prompt = torch.from_numpy(build_prompt(np.asarray(haystacks("passkey", a, 50, 1, None)[0]), 0.5, a, key))[None]
    reader = CopyAfterMarker(VOCAB, a.marker, guess=a.digits[0])
    assert score_prompts(reader, prompt, 5, BOS, 1, a.digits).free.tolist() == [[True] * 5]
    prompt[0, 25 + len(a.marker) + 2] = a.digits[0]     # the needle's third symbol altered: only it is missed
    scores = score_prompts(reader, prompt, 5, BOS, 1, a.digits)
    assert scores.free.tolist() == scores.forced.tolist() == [[True, True, False, True, True]]


def test_alphabet_refuses_a_vocabulary_too_small():
    with pytest.raises(ValueError, match="needs 3 ids besides BOS"):
        alphabet_for(3, 2, 64)
    with pytest.raises(ValueError, match="must occur nowhere else"):
        Alphabet(marker=(1, 2), digits=(1, 3), filler=(3,), bos=0).check()


@pytest.mark.parametrize("attention", ["exp", "power", "window"])
def test_one_forward_scores_as_the_forwards_of_each_prefix(attention):
    """A real (causal) GPT-2 in fp32: the last `digits` logits of one forward over BOS + prompt equal the last logit
    of a separate forward over each key symbol's prefix, and a final key written greedily from those prefixes (each
    symbol the prefix's argmax) scores every symbol right, one symbol changed scores it wrong."""
    from longctx.models import ATTENTIONS, build_model
    from longctx.models.spec import ModelSpec

    declared = {f.name for f in dataclasses.fields(ATTENTIONS[attention].Params)}
    params = {k: v for k, v in dict(window=7, chunk_size=8).items() if k in declared}
    torch.manual_seed(0)
    model = build_model(ModelSpec(arch="gpt2", attention=attention, vocab_size=VOCAB, d_model=32, n_layers=2,
                                  n_heads=2, ctx=64, attention_params=params)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)     # sharp, varied predictions
    a, digits = alphabet(), 5
    prompts = torch.from_numpy(np.stack([build_prompt(np.asarray(haystacks("passkey", a, 40, 1, None)[0]), depth, a,
                                                      np.asarray(a.digits[i:i + digits]))
                                         for i, depth in enumerate([0.0, 0.5, 1.0])]))
    T = prompts.shape[1]
    with torch.no_grad():
        for j in range(digits):                   # the final key, greedily: symbol j = argmax after its prefix
            with_bos = torch.cat([torch.full((3, 1), BOS), prompts], 1)
            prompts[:, T - digits + j] = model(with_bos[:, :T - digits + j + 1], last_only=True)[:, -1].argmax(-1)
        with_bos = torch.cat([torch.full((3, 1), BOS), prompts], 1)
        one = model(with_bos[:, :T], last_only=digits)
        each = torch.stack([model(with_bos[:, :T - digits + j + 1], last_only=True)[:, -1] for j in range(digits)], 1)
    torch.testing.assert_close(one, each, rtol=1e-5, atol=1e-5)
    assert score_prompts(model, prompts, digits, BOS, 2, a.digits, precision="fp32").free.all()
    prompts[1, T - 1] = (prompts[1, T - 1] + 1) % (VOCAB - 1)      # the last symbol of one key changed
    got = score_prompts(model, prompts, digits, BOS, 2, a.digits, precision="fp32").free
    assert got.sum() == 3 * digits - 1 and not got[1, -1]
