"""From the `data` config group to readers: the bundled ICL Markov data or any LongCrawl64-layout folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from longctx.data import LongCrawl64, check_vocab, dataset_info, ensure_icl_markov, heldout_batch


@dataclass
class DataSplits:
    train_path: Path
    heldout_path: Path
    info: dict  # dataset_info of the train split: vocab_size, bos_id, doc_len, ...


def icl_doc_len(data_cfg: DictConfig, ctx: int) -> int:
    return data_cfg.doc_len if data_cfg.doc_len is not None else max(1024, ctx)


def resolve_splits(data_cfg: DictConfig, ctx: int) -> DataSplits:
    """Locate (and for icl_markov, generate on first use) the train and heldout arrays."""
    if data_cfg.name == "icl_markov":
        doc_len = icl_doc_len(data_cfg, ctx)
        root = ensure_icl_markov(
            data_cfg.cache_dir, vocab=data_cfg.vocab, alpha=data_cfg.alpha, doc_len=doc_len,
            n_train=max(1, data_cfg.train_tokens // doc_len), n_heldout=data_cfg.n_heldout,
            seed=data_cfg.gen_seed, state_counts=data_cfg.get("state_counts"),
        )
        train, heldout = Path(root) / "train.zarr", Path(root) / "heldout.zarr"
    else:
        if data_cfg.path is None:
            raise ValueError("data.path: not set; point it at the folder holding train.zarr and heldout.zarr")
        root = Path(data_cfg.path).expanduser()
        if not root.exists():
            raise FileNotFoundError(f"data.path={str(root)!r}: does not exist")
        train, heldout = root / data_cfg.train_split, root / data_cfg.heldout_split
    info = dataset_info(train)
    if ctx > info["doc_len"]:
        raise ValueError(f"ctx={ctx} is larger than the documents of {train} (doc_len={info['doc_len']})")
    return DataSplits(train_path=train, heldout_path=heldout, info=info)


def build_train_reader(splits: DataSplits, data_cfg: DictConfig, ctx: int, rank: int, world_size: int,
                       vocab_size: int) -> LongCrawl64:
    reader = LongCrawl64(str(splits.train_path), ctx, data_cfg.docs_per_batch, rank=rank, world_size=world_size,
                         reshape_block=data_cfg.reshape_block)
    check_vocab(reader, vocab_size)
    return reader


def build_heldout(splits: DataSplits, data_cfg: DictConfig, ctx: int) -> dict:
    return heldout_batch(str(splits.heldout_path), ctx, data_cfg.eval_docs)
