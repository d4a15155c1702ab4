"""The paths a run's config names, made absolute before the run records its config (config.yaml, and the config
inside every checkpoint): the run then finds its data, dataset cache and initial weights from any folder, and a
relaunch that names the same folder relatively is the same config, not a change."""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

RUN_PATH_KEYS = ("data.path", "data.cache_dir", "cache_dir", "trainer.init_from")


def absolute(path) -> str:
    """`~` expanded and made absolute against the current folder; symbolic links kept as named (a run's name comes
    from its data folder's name)."""
    return os.path.abspath(os.path.expanduser(str(path)))


def resolve_run_paths(cfg: DictConfig | dict) -> DictConfig | dict:
    """The RUN_PATH_KEYS of a config made absolute: a DictConfig in place (returned), a plain dict (a checkpoint's
    saved config) as a new dict. Keys that are absent, unset or null are left as they are."""
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    for key in RUN_PATH_KEYS:
        value = OmegaConf.select(node, key, default=None, throw_on_missing=False)
        if isinstance(value, str) and value:
            OmegaConf.update(node, key, absolute(value), merge=False)
    return node if isinstance(cfg, DictConfig) else OmegaConf.to_container(node)
