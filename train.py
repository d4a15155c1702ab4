"""Train a long-context language model.

    python train.py                                        # tiny GPT-2, bundled ICL Markov data, CPU
    python train.py attention=power p=2 ctx=512
    python train.py arch=rwkv7 attention=power p=2 ctx=65536 model=small data=longcrawl64 data.path=/data/lc64

Every key of conf/ can be overridden on the command line; `python train.py --help` lists the groups.
"""
import hydra
from omegaconf import DictConfig

from longctx.train import run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    main()
