"""Reader for token arrays in the LongCrawl64 layout (real LongCrawl64 and the bundled default dataset).

One split is a zarr array `[N, doc_len]` of token ids (see `_array.py`). The order is the authors'
sampler (manifestai.com/articles/longcrawl64): the array is cut into rectangles of
`docs_per_batch x context_length` and walked in column-major order, down the documents first, then along
the context:

    R = N // B                      rectangles per column (trailing N % B documents are dropped)
    C = doc_len // T                columns (trailing doc_len % T positions are dropped)
    batch i (0 <= i < R * C):       documents (i % R) * B ... + B,  positions (i // R) * T ... + T
    targets = that slice;  inputs = targets rolled right by one with bos_id at position 0

With `world_size` ranks, rank r takes documents `r * B/W ... (r+1) * B/W` of every rectangle: the shares
are disjoint and together are the whole rectangle. The iterator runs forever (epoch after epoch, same
order); `state_dict()` holds the index of the next batch, so resuming yields exactly the batches an
uninterrupted run would have.

Reading: blocks of chunk-aligned documents x one column of positions are decoded once (only this rank's
rows are kept), cached, and read ahead by a thread pool one block in advance, while a producer thread
assembles `prefetch` batches ahead of the consumer. Zarr's decompression releases the GIL.
"""
from __future__ import annotations

import math
import queue
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from ._array import GPT2_EOT, array_attrs, array_dir, bayes_path, check_chunks_present, info, open_tokens, read_region


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{name}: must be a positive integer, got {v!r}")
    return int(v)


def _bos(bos_id, arr) -> int:
    if bos_id is None:
        bos_id = array_attrs(arr).get("bos_id", GPT2_EOT)
    return int(bos_id)


def packed_doc_ids(inputs, bos_id: int):
    """Packed rows (prepare_dataset --pack): each document is stored as its tokens then the EOT/BOS id, so in the
    inputs (targets shifted right, bos at position 0) every document starts at a bos. (n, T) -> (n, T) int64
    numbering the documents of each row, 0 first (numpy or torch in, the same out)."""
    starts = inputs == bos_id
    return starts.cumsum(1) - 1


def _shift_right(targets: np.ndarray, bos_id: int) -> np.ndarray:
    """(n, T) -> (n, T): inputs[:, 0] = bos_id, inputs[:, t] = targets[:, t - 1]."""
    inputs = np.empty_like(targets)
    inputs[:, 0] = bos_id
    inputs[:, 1:] = targets[:, :-1]
    return inputs


class LongCrawl64:
    """Iterate `{"inputs", "targets"}` batches of one LongCrawl64-layout split, forever, in the authors' order.

    Args:
        path: one split's zarr array, e.g. `.../train.zarr` (`[N, doc_len]` uint16; zarr format v2 or v3).
        context_length: T, tokens per row. Must be <= doc_len.
        docs_per_batch: B, documents per global batch (all ranks together). Must be divisible by world_size.
        rank, world_size: this process's share; rank r yields documents r*B/W ... (r+1)*B/W of each rectangle.
        bos_id: id placed at inputs[:, 0]. Default: the array's `bos_id` attribute, else 50256 (GPT-2 EOT).
        reshape_block: None, or K dividing T: the paper's "no long context" ablation. The same
            `B x T` rectangles are read, then each row is cut into T/K rows of K tokens, each with bos at
            position 0; batches are `(B/W * T/K, K)`.
        packed: the array holds packed documents (prepare_dataset --pack): each batch also carries
            `doc_ids` (packed_doc_ids). A column after the first starts inside a document: that part of it is
            a document of the batch, from its bos on, as the unpacked reader's columns are.
        prefetch: batches assembled ahead by the background thread. Default 2.
        max_block_bytes: cap on one cached block (this rank's rows of a chunk-row x one column). Default 512 MiB.
        num_threads: threads decoding blocks. Default 2.
        vocab_limit: None, or the model's vocabulary size: every block read is checked for ids >= it, and the
            first one found raises ValueError naming it, its document and position (instead of an index error
            in the embedding, mid-run). Default None.
    Yields:
        dict(inputs=int64 (B/W, T), targets=int64 (B/W, T)) — `(B/W * T/K, K)` with reshape_block=K.

    Example:
        >>> loader = LongCrawl64("lc64/train.zarr", context_length=65536, docs_per_batch=32, rank=0, world_size=8)
        >>> batch = next(iter(loader)); batch["inputs"].shape
        torch.Size([4, 65536])
        >>> ckpt = loader.state_dict()   # later: loader.load_state_dict(ckpt); next(iter(loader)) is the next batch
    """

    def __init__(self, path, context_length: int, docs_per_batch: int, rank: int = 0, world_size: int = 1, *,
                 bos_id: int | None = None, reshape_block: int | None = None, prefetch: int = 2,
                 max_block_bytes: int = 512 << 20, num_threads: int = 2, vocab_limit: int | None = None,
                 packed: bool = False):
        self.array = open_tokens(path)
        self.packed = bool(packed)
        self.path = str(path)
        T = _positive_int("context_length (ctx)", context_length)
        B = _positive_int("docs_per_batch", docs_per_batch)
        W = _positive_int("world_size", world_size)
        N, L = (int(s) for s in self.array.shape)
        if T > L:
            raise ValueError(f"context_length (ctx)={T} > doc_len={L} of {self.path}: documents are too short")
        if B > N:
            raise ValueError(f"docs_per_batch={B} > num_docs={N} of {self.path}")
        if B % W:
            raise ValueError(f"docs_per_batch={B} is not divisible by world_size={W}")
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < W:
            raise ValueError(f"rank={rank!r} must be an integer in [0, world_size={W})")
        if reshape_block is not None:
            K = _positive_int("reshape_block", reshape_block)
            if T % K:
                raise ValueError(f"reshape_block={K} must divide context_length (ctx)={T}")
        self.context_length, self.docs_per_batch = T, B
        self.rank, self.world_size = int(rank), W
        self.docs_per_rank = B // W
        self.reshape_block = reshape_block
        self.prefetch = max(1, int(prefetch))
        self.num_threads = max(1, int(num_threads))
        self.num_docs, self.doc_len = N, L
        self.bos_id = _bos(bos_id, self.array)
        self.vocab_limit = None if vocab_limit is None else _positive_int("vocab_limit", vocab_limit)
        # every chunk this reader will ever read must exist: zarr reads a missing one as token 0, silently
        check_chunks_present(self.array, slice(0, (N // B) * B), slice(0, (L // T) * T))
        self.vocab_size = int(array_attrs(self.array).get("vocab_size", max(self.bos_id + 1, 50257)))
        self.rows_per_column = N // B                      # R
        self.columns = L // T                              # C
        # Block: S consecutive documents (chunk-aligned when the budget allows) x one column of T positions.
        itemsize = np.dtype(self.array.dtype).itemsize
        chunk_docs = int(self.array.chunks[0])
        per_doc = T * itemsize / W                         # bytes one document costs this rank
        S = chunk_docs
        if S * per_doc > max_block_bytes:
            S = max(1, int(max_block_bytes // per_doc))
        self.block_docs = S
        self._lookahead = math.ceil(S / self.docs_per_rank / W) + 1  # batches spanning about one block
        self._next = 0                                     # global index of the next batch to yield
        self._iteration = 0
        self._worker: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._pool: ThreadPoolExecutor | None = None

    # ----- order ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch (R * C)."""
        return self.rows_per_column * self.columns

    def rectangle(self, i: int) -> tuple[slice, slice]:
        """(documents, positions) of this rank's share of global batch i (any i >= 0; wraps per epoch)."""
        i = int(i) % len(self)
        R, T, b = self.rows_per_column, self.context_length, self.docs_per_rank
        d0 = (i % R) * self.docs_per_batch + self.rank * b
        t0 = (i // R) * T
        return slice(d0, d0 + b), slice(t0, t0 + T)

    @property
    def epoch(self) -> int:
        return self._next // len(self)

    def state_dict(self) -> dict:
        return {"batch": self._next, "num_docs": self.num_docs, "doc_len": self.doc_len,
                "context_length": self.context_length, "docs_per_batch": self.docs_per_batch,
                "reshape_block": self.reshape_block}

    def load_state_dict(self, state: dict) -> None:
        for key in ("num_docs", "doc_len", "context_length", "docs_per_batch", "reshape_block"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"data state: checkpoint has {key}={state[key]!r} but this loader has "
                                 f"{key}={getattr(self, key)!r}; the batch order would differ")
        batch = state["batch"]
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ValueError(f"data state: batch={batch!r} is not a batch count >= 0")
        self._stop_worker()
        self._next = batch

    # ----- iteration -----------------------------------------------------------------------------------
    def __iter__(self):
        self._stop_worker()
        self._iteration += 1
        iteration = self._iteration
        stop = threading.Event()
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="lc64-read")
        self._stop = stop
        self._worker = threading.Thread(target=self._produce, args=(weakref.ref(self), self._next, q, stop),
                                        daemon=True, name="lc64-batches")
        self._worker.start()
        return self._consume(iteration, q, stop)

    def _consume(self, iteration, q, stop):
        while True:
            if self._iteration != iteration:
                raise RuntimeError("this LongCrawl64 iterator was superseded by a later iter(), "
                                   "load_state_dict() or close(); call iter(loader) again")
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            self._next += 1
            yield item

    def batch(self, i: int) -> dict:
        """Global batch i for this rank, read synchronously (no cache); the iterator yields the same."""
        docs, pos = self.rectangle(i)
        data = read_region(self.array, docs, pos)
        self._check_ids(data, docs.start, pos.start)
        return self._to_batch(data)

    def _to_batch(self, targets: np.ndarray) -> dict:
        targets = targets.astype(np.int64)
        if self.reshape_block is not None:
            targets = targets.reshape(-1, self.reshape_block)
        inputs = _shift_right(targets, self.bos_id)
        batch = {"inputs": torch.from_numpy(inputs), "targets": torch.from_numpy(targets)}
        if self.packed:
            batch["doc_ids"] = torch.from_numpy(packed_doc_ids(inputs, self.bos_id))
        return batch

    # blocks: key (c, i_col) -> this rank's rows of documents [c*S, (c+1)*S) x column i_col
    def _block_keys(self, batches: np.ndarray) -> list[tuple[int, int]]:
        batches = batches % len(self)
        R, S, b = self.rows_per_column, self.block_docs, self.docs_per_rank
        d0 = (batches % R) * self.docs_per_batch + self.rank * b
        col = batches // R
        keys = []
        for c0, c1, j in zip((d0 // S).tolist(), ((d0 + b - 1) // S).tolist(), col.tolist()):
            keys.extend((c, j) for c in range(c0, c1 + 1))
        return list(dict.fromkeys(keys))

    def _block_rows(self, c: int) -> np.ndarray:
        lo = c * self.block_docs
        hi = min((c + 1) * self.block_docs, self.rows_per_column * self.docs_per_batch)
        d = np.arange(lo, hi)
        return d[(d % self.docs_per_batch) // self.docs_per_rank == self.rank]

    def _read_block(self, key) -> tuple[np.ndarray, np.ndarray]:
        c, j = key
        rows = self._block_rows(c)
        pos = slice(j * self.context_length, (j + 1) * self.context_length)
        if len(rows) == rows[-1] - rows[0] + 1:
            data = read_region(self.array, slice(int(rows[0]), int(rows[-1]) + 1), pos)
        else:
            data = read_region(self.array, rows, pos)
        self._check_ids(data, rows, pos.start)
        return rows, data

    def _check_ids(self, data: np.ndarray, rows, t0: int) -> None:
        """Refuse ids the model cannot embed (vocab_limit), naming the first one's document and position."""
        if self.vocab_limit is None or data.size == 0 or int(data.max()) < self.vocab_limit:
            return
        r, t = (int(v) for v in np.argwhere(data >= self.vocab_limit)[0])
        doc = rows + r if isinstance(rows, int) else int(np.asarray(rows)[r])
        raise ValueError(f"data.path: token id {int(data[r, t])} at document {doc}, position {t0 + t} of {self.path} "
                         f">= model vocab_size={self.vocab_limit} (the array's max_token_id attribute, "
                         f"{array_attrs(self.array).get('max_token_id')}, is wrong or the data was changed)")

    def _assemble(self, i: int, blocks: dict) -> dict:
        """Batch i from cached blocks; keeps `blocks` to this batch's blocks plus the next block's."""
        need = self._block_keys(np.array([i]))
        ahead = self._block_keys(np.arange(i + 1, i + 1 + self._lookahead))
        for key in [k for k in blocks if k not in need and k not in ahead]:
            blocks.pop(key).cancel()
        for key in need:
            if key not in blocks:
                blocks[key] = self._pool.submit(self._read_block, key)
        docs, _ = self.rectangle(i)
        parts = []
        for key in need:
            rows, data = blocks[key].result()
            lo = np.searchsorted(rows, docs.start)
            hi = np.searchsorted(rows, docs.stop - 1, side="right")
            parts.append(data[lo:hi])
        for key in ahead:  # read the next block while the consumer works through this one
            if key not in blocks:
                blocks[key] = self._pool.submit(self._read_block, key)
        return self._to_batch(parts[0] if len(parts) == 1 else np.concatenate(parts))

    @staticmethod
    def _produce(wself: weakref.ref, start: int, q: queue.Queue, stop: threading.Event) -> None:
        """Producer thread. Holds the reader only weakly between batches, so a reader dropped without
        close() is still collected (and its thread ends)."""
        blocks: dict[tuple[int, int], Future] = {}

        def put(item) -> bool:
            while not stop.is_set() and wself() is not None:
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            i = start
            while not stop.is_set():
                reader = wself()
                if reader is None:
                    return
                item = reader._assemble(i, blocks)
                del reader
                if not put(item):
                    return
                i += 1
        except BaseException as e:  # hand the error to the consumer
            put(e)
        finally:
            for f in blocks.values():
                f.cancel()

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._stop.set()
            if self._worker is not threading.current_thread():
                self._worker.join()
            self._worker = None
        self._iteration += 1

    def close(self) -> None:
        """Stop the background threads (iteration can start again later)."""
        self._stop_worker()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"LongCrawl64({self.path!r}, context_length={self.context_length}, "
                f"docs_per_batch={self.docs_per_batch}, rank={self.rank}, world_size={self.world_size}, "
                f"bos_id={self.bos_id}, reshape_block={self.reshape_block}; {len(self)} batches/epoch)")


def heldout_batch(path, context_length: int, num_docs: int, *, bos_id: int | None = None,
                  field: str = "data.path", packed: bool = False) -> dict:
    """The fixed evaluation subset: the first `num_docs` documents, positions [0, context_length).

    Returns dict(inputs=int64 (num_docs, T), targets=int64 (num_docs, T), bayes_nll=float32 (num_docs, T)
    or None). `bayes_nll` is the Bayes-optimal per-token NLL (nats) when the dataset has one (the
    array's `bayes_nll` attribute names it; the in-context Markov dataset does). A missing or undecodable chunk
    raises `ChunkError` naming it. packed: rows of packed documents (prepare_dataset --pack): the batch also
    holds `doc_ids` (n, T) int64 (packed_doc_ids).
    """
    arr = open_tokens(path, field=field)
    T = _positive_int("context_length (ctx)", context_length)
    n = _positive_int("num_docs", num_docs)
    N, L = (int(s) for s in arr.shape)
    if T > L:
        raise ValueError(f"context_length (ctx)={T} > doc_len={L} of {path}: documents are too short")
    if n > N:
        raise ValueError(f"num_docs={n} > the {N} documents of {path}")
    targets = read_region(arr, slice(0, n), slice(0, T), field=field).astype(np.int64)
    inputs = _shift_right(targets, _bos(bos_id, arr))
    bayes = None
    bp = bayes_path(arr)
    if bp is not None:
        import zarr
        nll = read_region(zarr.open_array(str(bp), mode="r"), slice(0, n), slice(0, T), field=f"{field} (bayes_nll)")
        bayes = torch.from_numpy(np.asarray(nll, dtype=np.float32))
    batch = {"inputs": torch.from_numpy(inputs), "targets": torch.from_numpy(targets), "bayes_nll": bayes}
    if packed:
        batch["doc_ids"] = torch.from_numpy(packed_doc_ids(inputs, _bos(bos_id, arr)))
    queries = array_attrs(arr).get("queries")  # recall data (MQAR): where its answers are, measured there only
    if queries is not None:
        batch.update(_queries(arr, queries, n, T, field))
    return batch


def joined_documents(path, length: int, num_rows: int, *, field: str = "data.path") -> np.ndarray:
    """A packed split's documents (prepare_dataset --pack) joined without their EOT/BOS ids and cut into up to
    `num_rows` rows of `length` tokens (fewer where the split runs out): int64 text holding no document boundary,
    e.g. the needle task's haystacks, which a model trained on packed rows reads as one document."""
    arr = open_tokens(path, field=field)
    bos = _bos(None, arr)
    N, L = (int(s) for s in arr.shape)
    need = _positive_int("length", length) * _positive_int("num_rows", num_rows)
    parts, have, r = [], 0, 0
    while have < need and r < N:
        step = max(1, -(-(need - have) // L))  # rows that would do if they held no EOT
        block = read_region(arr, slice(r, min(N, r + step)), slice(0, L), field=field).reshape(-1)
        parts.append(block[block != bos])
        have, r = have + len(parts[-1]), r + step
    flat = np.concatenate(parts)[:min(have, need) // length * length]
    return flat.astype(np.int64).reshape(-1, length)


def _queries(arr, name: str, n: int, T: int, field: str) -> dict:
    """The first n documents' queries (n, 2, Q) int64 (value positions, distances), all within the first T
    positions, and the number of values a query's answer is drawn from."""
    import zarr

    folder = array_dir(arr)
    if folder is None:
        raise ValueError(f"{field}: the heldout array names its queries ({name!r}) but is not in a folder")
    where = folder.parent / name
    if not where.exists():
        raise FileNotFoundError(f"{field}: the heldout queries {str(where)!r} are missing")
    try:
        queries = np.asarray(zarr.open_array(str(where), mode="r")[:n], dtype=np.int64)
    except Exception as err:  # zarr's errors name no file
        raise ValueError(f"{field}: the heldout queries {str(where)!r} cannot be read ({type(err).__name__})") from None
    if queries.ndim != 3 or queries.shape[:2] != (n, 2):
        raise ValueError(f"{field}: the heldout queries {str(where)!r} have shape {queries.shape}, "
                         f"expected ({n}, 2, Q)")
    last = int(queries[:, 0].max())
    if last >= T:
        raise ValueError(f"ctx={T}: the heldout documents ask queries up to position {last}; recall data is "
                         f"evaluated at the context it was generated for (ctx >= {last + 1})")
    generator = array_attrs(arr).get("generator") or {}
    return {"queries": torch.from_numpy(queries), "n_values": generator.get("n_values")}


def dataset_info(path) -> dict:
    """vocab_size, bos_id, num_docs, doc_len, dtype, chunks, zarr_format, rolled, tokenizer, generator params,
    and the path of the Bayes-optimal NLL array (or None) of one split's zarr array."""
    d = info(open_tokens(path))
    d["path"] = str(path)
    return d


def check_vocab(path_or_reader, vocab_size: int, *, max_scan_tokens: int = 1 << 26, field: str = "data.path") -> int:
    """Raise ValueError if the data holds token ids >= `vocab_size` (the model's vocabulary), naming the id, the
    vocabulary and `field`.

    Checks bos_id and the array's recorded `max_token_id` attribute, then reads a sample (recorded or not: an
    attribute can be wrong): the whole array if it has at most `max_scan_tokens` tokens, else evenly spaced whole
    chunks up to that budget. Returns the largest id seen (or recorded, if larger).
    """
    vocab_size = _positive_int("vocab_size", vocab_size)
    if isinstance(path_or_reader, LongCrawl64):
        arr, bos, where = path_or_reader.array, path_or_reader.bos_id, path_or_reader.path
    else:
        arr = open_tokens(path_or_reader, field=field)
        bos, where = _bos(None, arr), str(path_or_reader)
    if bos >= vocab_size:
        raise ValueError(f"{field}: bos_id={bos} >= model vocab_size={vocab_size} ({where})")
    recorded = array_attrs(arr).get("max_token_id")
    if recorded is not None and int(recorded) >= vocab_size:
        raise ValueError(f"{field}: token id {recorded} (max_token_id of {where}) >= model vocab_size={vocab_size}")
    N, L = (int(s) for s in arr.shape)
    cd, ct = (max(1, int(c)) for c in arr.chunks)
    if N * L <= max_scan_tokens:          # small: scan everything, one chunk-row at a time
        blocks = [(slice(lo, min(lo + cd, N)), slice(0, L)) for lo in range(0, N, cd)]
    else:                                 # large: evenly spaced whole chunks up to the budget
        grid = [(a, b) for a in range(0, N, cd) for b in range(0, L, ct)]
        n_pick = max(1, min(len(grid), max_scan_tokens // (cd * ct)))
        grid = [grid[int(k)] for k in np.unique(np.linspace(0, len(grid) - 1, n_pick).round().astype(int))]
        blocks = [(slice(a, min(a + cd, N)), slice(b, min(b + ct, L))) for a, b in grid]
    top = 0
    for docs, pos in blocks:
        block = read_region(arr, docs, pos, field=field)
        m = int(block.max())
        if m >= vocab_size:
            d, t = np.argwhere(block >= vocab_size)[0]
            lie = f"; the array records max_token_id={recorded}, which is wrong" if recorded is not None else ""
            raise ValueError(f"{field}: token id {int(block[d, t])} at document {docs.start + int(d)}, position "
                             f"{pos.start + int(t)} of {where} >= model vocab_size={vocab_size}{lie}")
        top = max(top, m)
    return max(top, int(recorded)) if recorded is not None else top
