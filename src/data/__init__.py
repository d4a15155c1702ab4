"""Data: the LongCrawl64-layout reader, the in-context Markov default dataset, dataset preparation, tokenizers.

See docs/data.md for the layout, the sampler's order, and how to point `data.path` at real LongCrawl64.
"""
from ._array import ChunkError
from .icl_markov import ensure_icl_markov
from .longcrawl64 import LongCrawl64, check_vocab, dataset_info, heldout_batch
from .tokenizer import load_tokenizer

__all__ = ["LongCrawl64", "ensure_icl_markov", "heldout_batch", "dataset_info", "check_vocab", "load_tokenizer",
           "ChunkError"]
