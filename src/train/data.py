"""From the `data` config group to readers: the bundled ICL Markov data or any LongCrawl64-layout folder."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from longctx.data import LongCrawl64, check_vocab, dataset_info, ensure_icl_markov, heldout_batch
from longctx.data.icl_markov import generator_params as icl_markov_generator_params
from longctx.data.mqar import ensure_mqar, query_targets
from longctx.data.mqar import generator_params as mqar_generator_params
from longctx.data.tokenizer import check_splits_agree
from longctx.models.context_parallel import ContextParallel, context_slice

log = logging.getLogger("longctx")


@dataclass
class DataSplits:
    train_path: Path
    heldout_path: Path
    info: dict  # dataset_info of the train split: vocab_size, bos_id, doc_len, ...


def icl_doc_len(data_cfg: DictConfig, ctx: int) -> int:
    return data_cfg.doc_len if data_cfg.doc_len is not None else max(1024, ctx)


def icl_markov_params(data_cfg, ctx: int) -> dict:
    """The generator's arguments (`ensure_icl_markov`, `icl_markov.generator_params`) an ICL Markov data config
    and context stand for: the dataset a run at this ctx trains and evaluates on."""
    doc_len = icl_doc_len(data_cfg, ctx)
    return dict(vocab=data_cfg.vocab, alpha=data_cfg.alpha, doc_len=doc_len,
                n_train=max(1, int(data_cfg.train_tokens) // doc_len), n_heldout=data_cfg.n_heldout,
                seed=data_cfg.gen_seed, state_counts=data_cfg.get("state_counts"),
                disjoint_sizes=data_cfg.get("disjoint_sizes", False))


def mqar_params(data_cfg, ctx: int) -> dict:
    """The generator's arguments (`ensure_mqar`, `mqar.generator_params`) an MQAR data config and context stand for:
    a document is as long as the context (its queries are asked within it)."""
    return dict(n_keys=data_cfg.n_keys, n_values=data_cfg.n_values, n_pairs=data_cfg.n_pairs,
                n_queries=data_cfg.n_queries, doc_len=ctx, n_train=max(1, data_cfg.train_tokens // ctx),
                n_heldout=data_cfg.n_heldout, distance=data_cfg.distance, power_a=data_cfg.power_a,
                seed=data_cfg.gen_seed)


def check_generated_data(data_cfg: DictConfig, ctx: int) -> None:
    """A generated task's parameters checked without generating anything (ValueError naming the `data.` field), so
    a bad value is named before a run folder or a cache is looked at."""
    if data_cfg.name == "icl_markov":
        icl_markov_generator_params(**icl_markov_params(data_cfg, ctx))
    elif data_cfg.name == "mqar":
        mqar_generator_params(**mqar_params(data_cfg, ctx))


def resolve_splits(data_cfg: DictConfig, ctx: int, ctx_key: str = "ctx") -> DataSplits:
    """Locate (and for the generated tasks, icl_markov and mqar, generate on first use) the train and heldout
    arrays. An MQAR document is as long as the context (its queries are asked within it). ctx_key: what a ctx
    longer than the documents is refused as (`--ctx` where a tool's flag gave it)."""
    if data_cfg.name == "icl_markov":
        root = ensure_icl_markov(data_cfg.cache_dir, **icl_markov_params(data_cfg, ctx),
                                 progress=sys.stderr.isatty())  # a bar's redraws would flood a log file
        train, heldout = Path(root) / "train.zarr", Path(root) / "heldout.zarr"
    elif data_cfg.name == "mqar":
        root = ensure_mqar(data_cfg.cache_dir, **mqar_params(data_cfg, ctx), progress=sys.stderr.isatty())
        train, heldout = Path(root) / "train.zarr", Path(root) / "heldout.zarr"
    else:
        if OmegaConf.is_missing(data_cfg, "path") or data_cfg.path in (None, ""):
            raise ValueError("data.path: not set; point it at the folder holding train.zarr and heldout.zarr")
        root = Path(data_cfg.path).expanduser()
        if not root.exists():
            raise FileNotFoundError(f"data.path={str(root)!r}: does not exist")
        train, heldout = root / data_cfg.train_split, root / data_cfg.heldout_split
        if train.resolve() == heldout.resolve():   # a heldout loss of trained-on documents would read as one
            raise ValueError(f"data.heldout_split={data_cfg.heldout_split!r}: the same array as data.train_split="
                             f"{data_cfg.train_split!r} ({train.resolve()}); the heldout documents must be others")
    info = dataset_info(train)
    check_splits_agree(train, heldout)  # ids of one tokenizer in both splits
    if data_cfg.get("pack", False) and not info["packed"]:
        raise ValueError(f"data.pack=true: {train} holds no document boundaries (one document per row, not "
                         f"prepared with --pack); prepare it with scripts/prepare_dataset.py --pack, or set "
                         f"data.pack=false")
    if ctx > info["doc_len"]:
        raise ValueError(f"{ctx_key}={ctx} is larger than the documents of {train} (doc_len={info['doc_len']})")
    if info["packed"] and not data_cfg.get("pack", False):
        log.warning(f"data.pack=false: {train} holds packed documents; they attend to each other across their "
                    f"boundaries (set data.pack=true to keep them apart)")
    return DataSplits(train_path=train, heldout_path=heldout, info=info)


def check_batch_fits(splits: DataSplits, data_cfg: DictConfig) -> None:
    if data_cfg.docs_per_batch > splits.info["num_docs"]:
        raise ValueError(f"data.docs_per_batch={data_cfg.docs_per_batch} is more than the "
                         f"{splits.info['num_docs']} documents of {splits.train_path}")


def trains_on_queries(data_cfg: DictConfig) -> bool:
    """data.loss_on=queries (recall data's default): the training loss counts the queried values only."""
    return data_cfg.get("loss_on", "all") == "queries"


def build_train_reader(splits: DataSplits, data_cfg: DictConfig, ctx: int, rank: int, world_size: int,
                       vocab_size: int):
    """The rank's training reader (a LongCrawl64; with data.loss_on=queries, wrapped by QueryTargets)."""
    check_batch_fits(splits, data_cfg)
    reader = LongCrawl64(str(splits.train_path), ctx, data_cfg.docs_per_batch, rank=rank, world_size=world_size,
                         reshape_block=data_cfg.reshape_block, vocab_limit=vocab_size,
                         packed=data_cfg.get("pack", False))
    check_vocab(reader, vocab_size)  # BOS and a sample of chunks now; every block the reader decodes later
    return QueryTargets(reader, data_cfg) if trains_on_queries(data_cfg) else reader


def epoch_tokens(reader, docs_per_batch: int, ctx: int) -> int:
    """Tokens one pass over the training split serves (build_train_reader's reader, wrapped or not): its batches per
    epoch times a batch's tokens. Fewer than the split holds where ctx does not divide the documents' length or the
    batch their number: the reader leaves those positions and documents out."""
    while isinstance(reader, MappedBatches):
        reader = reader.reader
    return len(reader) * docs_per_batch * ctx


class MappedBatches:
    """A reader whose batches pass through `map_batch`; everything else (the batch order, state_dict, the array) is
    the reader's, so a checkpoint does not depend on the mapping."""

    def __init__(self, reader):
        self.reader = reader

    def map_batch(self, batch: dict) -> dict:
        raise NotImplementedError

    def __iter__(self):
        for batch in self.reader:
            yield self.map_batch(batch)

    def state_dict(self) -> dict:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)

    def __getattr__(self, name):  # the reader's other attributes (path, array, ...)
        if name == "reader":
            raise AttributeError(name)
        return getattr(self.reader, name)


class ContextSlices(MappedBatches):
    """A reader's batches cut along the context for context parallelism: rank `rank` of `world` gets positions
    [rank * T / world, (rank + 1) * T / world) of every (docs, T) tensor, inputs and targets alike, so a slice's
    first input is the previous slice's last target (the documents' own token). Each rank reads its documents whole
    and keeps its slice (the reader decodes whole chunks anyway)."""

    def __init__(self, reader, rank: int, world: int):
        super().__init__(reader)
        self.cp = ContextParallel(group=None, rank=rank, world=world)  # the slice, no exchange

    def map_batch(self, batch: dict) -> dict:
        return {k: context_slice(v, self.cp) for k, v in batch.items()}


class QueryTargets(MappedBatches):
    """MQAR batches whose targets other than the queried values are ignored by the loss (data.loss_on=queries)."""

    def __init__(self, reader, data_cfg: DictConfig):
        super().__init__(reader)
        self.ids = dict(n_keys=data_cfg.n_keys, n_values=data_cfg.n_values, n_pairs=data_cfg.n_pairs)

    def map_batch(self, batch: dict) -> dict:
        return query_targets(batch, **self.ids)


def build_heldout(splits: DataSplits, data_cfg: DictConfig, ctx: int, vocab_size: int,
                  docs_key: str = "data.eval_docs") -> dict:
    """The fixed evaluation documents, checked against the model's vocabulary now rather than at the first
    evaluation. A heldout split smaller than data.eval_docs (a small prepared dataset) is used whole, with a
    warning: it is all the heldout data there is, and stopping would only make the user look up its size.
    docs_key: how the caller sets the number (evaluate's `--docs`)."""
    available = dataset_info(splits.heldout_path)["num_docs"]
    n = data_cfg.eval_docs
    if n > available:
        sep = " " if docs_key.startswith("--") else "="
        log.warning(f"{docs_key}{sep}{n} but {splits.heldout_path} holds {available} documents: evaluating on all "
                    f"{available} (set {docs_key}{sep}{available} to silence this)")
        n = available
    packed = data_cfg.get("pack", False)
    if packed and not dataset_info(splits.heldout_path)["packed"]:
        raise ValueError(f"data.pack=true: the heldout split {splits.heldout_path} holds no document boundaries "
                         f"(not prepared with --pack)")
    heldout = heldout_batch(str(splits.heldout_path), ctx, n, packed=packed)
    bos = int(heldout["inputs"][0, 0])
    if bos >= vocab_size:
        raise ValueError(f"data.heldout_split: bos_id={bos} of {splits.heldout_path} >= model vocab_size={vocab_size}, "
                         f"which comes from {splits.train_path}'s vocab_size={splits.info['vocab_size']}")
    top = int(heldout["targets"].max())
    if top >= vocab_size:
        raise ValueError(f"data: heldout token id {top} in {splits.heldout_path} (the data.eval_docs={n} "
                         f"documents evaluated) >= model vocab_size={vocab_size}, which comes from "
                         f"{splits.train_path}'s vocab_size={splits.info['vocab_size']}")
    return heldout
