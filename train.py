"""Train a long-context language model.

    python train.py                                        # tiny GPT-2, bundled ICL Markov data, CPU
    python train.py attention=power p=2 ctx=512
    python train.py arch=rwkv7 attention=power p=2 ctx=65536 model=small data=longcrawl64 data.path=/data/lc64

Every key of conf/ can be overridden on the command line; `python train.py --help` lists the groups.
"""
import os
import sys

# Triton keeps autotuning winners on disk (FLA benchmarks its kernels' configs on first use, ~90 s per shape on
# an H100), so a second run on the same machine and shapes starts at once; TRITON_CACHE_AUTOTUNING=0 turns it off
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from longctx.train.trainer import Trainer  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        trainer = Trainer(cfg)  # every check of the config and the data happens here, before any training
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err}")  # bad input: one clear line naming the field, no traceback
    trainer.fit()


if __name__ == "__main__":
    main()
