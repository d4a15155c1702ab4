"""Tokenizers of prepared datasets, and `load_tokenizer(dataset_path)`: the one a dataset was written with.

Three kinds, each with `name`, `eot_id` (also the BOS id), `vocab_size`, `encode(text) -> list[int]`,
`decode(ids) -> str` and `encode_batch(texts) -> list[np.ndarray]`:

- `bpe`: byte-level BPE trained offline with HF `tokenizers` on a dataset's training split
  (`BPETokenizer.train`), saved as `tokenizer.json` inside the dataset folder. Byte-level, no normalizer and no
  prefix space, so `decode(encode(text)) == text` for any text; `<|endoftext|>` is id 0 and is never produced
  from text (a file that contains the string is encoded as its characters).
- `tiktoken-gpt2`: GPT-2 BPE via tiktoken (LongCrawl64's tokenizer; needs its vocabulary file, downloaded once).
- `bytes`: the UTF-8 bytes as ids 0..255, EOT 256 (nothing to download).

A run keeps a copy of its dataset's own tokenizer file (`tokenizer_file_of`) in its folder, so it decodes text
wherever it is, with or without its dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

EOT = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


class NotText(ValueError):
    """A dataset whose tokens are not text (synthetic data): it has no text tokenizer."""


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; EOT/BOS 256; vocab_size 257. Needs nothing from the network."""
    name = "bytes"
    eot_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="replace"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8", errors="replace"), dtype=np.uint8).astype(np.uint16) for t in texts]


class TiktokenGPT2:
    """GPT-2 BPE (tiktoken, LongCrawl64's tokenizer): EOT 50256, vocab_size 50257."""
    name = "tiktoken-gpt2"

    def __init__(self):
        import tiktoken
        self.enc = tiktoken.get_encoding("gpt2")
        self.eot_id = self.enc.eot_token
        self.vocab_size = self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.enc.decode([int(i) for i in ids])

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint16) for ids in self.enc.encode_ordinary_batch(texts)]


class BPETokenizer:
    """Byte-level BPE of HF `tokenizers`, trained on a dataset's training split (see `train`)."""

    def __init__(self, tok):
        tok.encode_special_tokens = True  # "<|endoftext|>" inside a text stays text: only the data writer adds EOT
        self.tok = tok
        self.eot_id = tok.token_to_id(EOT)
        if self.eot_id is None:
            raise ValueError(f"tokenizer: {EOT!r} is not in the vocabulary")
        self.vocab_size = tok.get_vocab_size()
        self.name = f"bpe-{self.vocab_size}"

    @classmethod
    def train(cls, texts, vocab_size: int) -> "BPETokenizer":
        """Train on an iterable of texts (the training split only: heldout text must not shape the vocabulary)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path) -> "BPETokenizer":
        from tokenizers import Tokenizer
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception (cut short, not JSON)
            reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            raise ValueError(f"{path}: not a readable tokenizer file ({reason})") from None
        return cls(tok)

    def save(self, path) -> None:
        self.tok.save(str(path))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.uint32) for e in self.tok.encode_batch(texts, add_special_tokens=False)]


def load_tokenizer(dataset_path):
    """The tokenizer a dataset's tokens were made with: `.encode(text)`, `.decode(ids)`, `.eot_id`, `.vocab_size`.

    Args:
        dataset_path: the dataset folder (holding train.zarr) or one split's array (`.../train.zarr`).
    Returns: a `BPETokenizer` when the dataset holds the `tokenizer.json` its metadata names, a `ByteTokenizer`
        for byte-level data, and GPT-2's tiktoken tokenizer for data that records `tiktoken-gpt2` or no tokenizer
        at all (real LongCrawl64 carries no attributes). Raises ValueError for synthetic data (no text tokenizer).

    Example:
        >>> tok = load_tokenizer("data/source_corpus")
        >>> tok.decode(tok.encode("def f(x):\\n    return x"))
        'def f(x):\\n    return x'
    """
    from ._array import array_attrs, open_tokens, own_file

    p = Path(os.path.expanduser(str(dataset_path)))
    root = p.parent if p.suffix == ".zarr" else p
    split = p if p.suffix == ".zarr" else p / "train.zarr"
    attrs = array_attrs(open_tokens(split, field="dataset_path"))
    name = attrs.get("tokenizer")
    if attrs.get("tokenizer_file"):
        f = own_file(root, attrs["tokenizer_file"], "tokenizer_file", split)
        if not f.is_file():
            raise FileNotFoundError(f"dataset_path: {str(root)!r} records tokenizer {name!r} in "
                                    f"{attrs['tokenizer_file']!r}, which is missing")
        return BPETokenizer.from_file(f)
    if name == "bytes":
        return ByteTokenizer()
    if name in (None, "tiktoken-gpt2"):
        if attrs.get("generator") is not None:
            raise NotText(f"dataset_path: {str(root)!r} is synthetic ({json.dumps(attrs['generator'])[:80]}...): "
                          "its tokens are not text")
        try:
            return TiktokenGPT2()
        except Exception as e:  # offline without a cached vocabulary
            raise RuntimeError(f"dataset_path: {str(root)!r} is GPT-2-tokenized, and tiktoken could not load the GPT-2 "
                               f"vocabulary ({type(e).__name__}); copy a tiktoken cache and set TIKTOKEN_CACHE_DIR "
                               f"to it") from None
    raise ValueError(f"dataset_path: {str(root)!r} records tokenizer {name!r}, which is unknown")


def tokenizer_file_of(split_path) -> Path | None:
    """The tokenizer file a dataset's split records (a prepared corpus's BPE `tokenizer.json`, beside its splits),
    None for data without one."""
    from ._array import array_attrs, open_tokens, own_file

    split = Path(os.path.expanduser(str(split_path)))
    name = array_attrs(open_tokens(split, field="data.path")).get("tokenizer_file")
    if not name:
        return None
    path = own_file(split.parent, name, "tokenizer_file", split)
    return path if path.is_file() else None


def split_tokens(split_path) -> dict:
    """What a split's ids mean: `tokenizer` (the name its array records; None where it records none: real
    LongCrawl64, generated data), `bos_id` (GPT-2's EOT where none is recorded, as the readers take it), `file`
    (its BPE vocabulary file, `tokenizer_file_of`, or None) and `sha256` (that file's, or None)."""
    from ._array import info, open_tokens

    meta = info(open_tokens(Path(os.path.expanduser(str(split_path))), field="data.path"))
    vocab = tokenizer_file_of(split_path)
    return {"tokenizer": meta["tokenizer"], "bos_id": meta["bos_id"], "file": vocab,
            "sha256": file_sha256(vocab) if vocab else None}


def file_sha256(path) -> str:
    """SHA-256 of a (tokenizer) file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tokens_differ(a: dict, b: dict) -> bool:
    """Whether ids read as `a` and as `b` (`split_tokens` records) stand for other text: another BOS id, another
    tokenizer (where both record one) or another BPE vocabulary (where both carry its file's hash: two BPEs of one
    size share their name; a record carrying the file carries its hash)."""
    if a.get("bos_id") is not None and b.get("bos_id") is not None and int(a["bos_id"]) != int(b["bos_id"]):
        return True
    if a.get("tokenizer") and b.get("tokenizer") and a["tokenizer"] != b["tokenizer"]:
        return True
    return bool(a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"])


def describe_tokens(t: dict) -> str:
    """A `split_tokens` record in words: 'tokenizer bpe-512 (bos_id=0, /data/ds/tokenizer.json)'."""
    where = f", {t['file']}" if t.get("file") else ""
    return f"tokenizer {t.get('tokenizer') or 'none recorded'} (bos_id={t.get('bos_id')}{where})"


def check_splits_agree(train_path, heldout_path) -> None:
    """A dataset's splits hold ids of one tokenizer and BOS (`tokens_differ`): a heldout split prepared apart from
    the training split would evaluate the model on ids that mean other text. ValueError naming both."""
    train, heldout = split_tokens(train_path), split_tokens(heldout_path)
    if tokens_differ(train, heldout):
        raise ValueError(f"data.heldout_split: {heldout_path} holds ids of {describe_tokens(heldout)}, but "
                         f"data.train_split {train_path} holds ids of {describe_tokens(train)}; prepare both splits "
                         f"with one tokenizer")
