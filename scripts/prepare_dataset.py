#!/usr/bin/env python
r"""Turn your own text into a dataset in the LongCrawl64 layout (`OUT/train.zarr`, `OUT/heldout.zarr`).

    # a folder of .txt files, one document per file
    python scripts/prepare_dataset.py --input corpus/ --out data/mycorpus --doc-len 8192
    # json lines / parquet / csv files (column --text-field), or a Hub dataset when online
    python scripts/prepare_dataset.py --input pages.jsonl --out data/pages --doc-len 65536
    python scripts/prepare_dataset.py --input togethercomputer/RedPajama-Data-V2 --hf-config sample \
        --text-field raw_content --out data/rpv2 --doc-len 65536 --zarr-format 2
    # long documents from source trees, offline: a package's files concatenated, heldout split by package,
    # a byte-level BPE tokenizer trained on the training packages (saved as OUT/tokenizer.json)
    SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python scripts/prepare_dataset.py --group-by package --input "$SITE" /usr/share/doc \
        --out data/source_corpus --doc-len 4096
    # then train on it
    python train.py data=longcrawl64 data.path=data/mycorpus ctx=8192
    python train.py data=source_corpus data.path=data/source_corpus ctx=4096

Tokenizes with GPT-2 BPE (tiktoken) when its vocabulary is available offline, else with a byte-level
tokenizer (ids = UTF-8 bytes, EOT 256, vocab 257; recorded in the arrays' attributes); keeps documents with
at least --doc-len tokens, truncates, shuffles, rolls, splits off a heldout set, and writes chunked zarr.
Streams: the corpus is never held in memory (--group-by package holds the package texts).

Every argument and path is checked before any work (one error line, exit 2, nothing written). An existing --out
is refused unless --overwrite, which replaces only a dataset this script wrote (never a folder of other files, nor
one you added a file to, inside its splits included, nor the input or a folder around it). A text file that is not
UTF-8 is named in a warning and skipped. A failed write (a full disk) is one error line and exit 1, with nothing
left behind and an --overwrite target untouched. See docs/data.md and `longctx.data.prepare` for the details.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from longctx.data.prepare import PrepareConfig, prepare_dataset


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, nargs="+",
                    help="file, folder of files, or Hub dataset name (several with --group-by package)")
    ap.add_argument("--out", required=True, help="output folder (gets train.zarr, heldout.zarr, prepare.json)")
    ap.add_argument("--doc-len", type=int, default=65536, help="tokens per document (LongCrawl64: 65536)")
    ap.add_argument("--heldout-frac", type=float, default=0.01, help="fraction of kept documents held out, in (0, 1)")
    ap.add_argument("--heldout-docs", type=int, default=None, help="exact number of heldout documents (>= 1)")
    ap.add_argument("--tokenizer", choices=["auto", "gpt2", "bytes", "bpe"], default="auto",
                    help="auto: gpt2 if its vocabulary loads, else bytes (bpe with --group-by package); bpe: "
                         "byte-level BPE trained on the training split (--group-by package)")
    ap.add_argument("--vocab-size", type=int, default=16384, help="vocabulary of the bpe tokenizer (258..65536)")
    ap.add_argument("--group-by", choices=["file", "package"], default="file",
                    help="file: one document per file/row (default); package: each package of source or "
                         "documentation trees concatenated, cut into --doc-len documents, heldout by package")
    ap.add_argument("--max-file-bytes", type=int, default=1 << 20,
                    help="--group-by package: skip larger files (mostly generated tables)")
    ap.add_argument("--no-roll", dest="rolled", action="store_false", help="store documents unrotated")
    ap.add_argument("--pack", action="store_true",
                    help="pack documents of any length into rows (each its tokens then EOT; not rolled; --max-docs "
                         "counts rows); train with data.pack=true")
    ap.add_argument("--seed", type=int, default=0, help="shuffle and roll seed")
    ap.add_argument("--chunk-docs", type=int, default=2048)
    ap.add_argument("--chunk-len", type=int, default=2048)
    ap.add_argument("--zarr-format", type=int, choices=[2, 3], default=3,
                    help="3 (zarr 3 default) or 2 (LongCrawl64's own: v2, Blosc lz4)")
    ap.add_argument("--text-field", default="text", help="column holding the text (json/parquet/csv/Hub)")
    ap.add_argument("--split", default="train", help="Hub split to read")
    ap.add_argument("--hf-config", default=None, help="Hub dataset configuration name")
    ap.add_argument("--sample-by", choices=["document", "paragraph", "line"], default="document",
                    help="for .txt input: what one document is (default: a whole file)")
    ap.add_argument("--max-docs", type=int, default=None, help="stop after this many kept documents")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="prepare_dataset: warning: %(message)s", stream=sys.stderr,
                        force=True)
    cfg = PrepareConfig(source=a.input, group_by=a.group_by, vocab_size=a.vocab_size, max_file_bytes=a.max_file_bytes,
                        out=a.out, doc_len=a.doc_len, heldout_frac=a.heldout_frac,
                        heldout_docs=a.heldout_docs, tokenizer=a.tokenizer, rolled=a.rolled, pack=a.pack, seed=a.seed,
                        chunk_docs=a.chunk_docs, chunk_len=a.chunk_len, zarr_format=a.zarr_format,
                        text_field=a.text_field, split=a.split, hf_config=a.hf_config, sample_by=a.sample_by,
                        max_docs=a.max_docs, overwrite=a.overwrite, progress=not a.quiet)
    try:
        summary = prepare_dataset(cfg)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        print(f"prepare_dataset: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the machine, not the arguments (a full disk): the temporary folder is already removed
        where = f": {e.filename}" if e.filename else ""
        print(f"prepare_dataset: error: {e.strerror or e}{where}; nothing was written to {a.out!r}",
              file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in summary.items() if k not in ("params", "package_tokens")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
