"""Train a long-context language model.

    python train.py                                        # tiny GPT-2, bundled ICL Markov data, CPU
    python train.py attention=power p=2 ctx=512
    python train.py arch=rwkv7 attention=power p=2 ctx=65536 model=small data=longcrawl64 data.path=/data/lc64

Every key of conf/ can be overridden on the command line; `python train.py --help` lists the groups.
"""
import os
import sys

import hydra
from omegaconf import DictConfig

from longctx.train.trainer import Trainer


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
