"""Shared fixtures: Hydra composition of the real config, a small cached ICL dataset, GPU skipping."""
from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

# `LONGCTX_TEST_GPUS=4 pytest -n 8 -m gpu`: pytest-xdist worker i uses GPU i % 4 of those visible (set before CUDA
# starts).
if os.environ.get("LONGCTX_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    _n = int(os.environ["LONGCTX_TEST_GPUS"])
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(_n)))).split(",")
    os.environ["CUDA_VISIBLE_DEVICES"] = _visible[int(os.environ["PYTEST_XDIST_WORKER"][2:]) % min(_n, len(_visible))]

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# Overrides that make the real default run small enough for the CPU test suite.
TINY = [
    "trainer.max_steps=6", "trainer.eval_every=3", "logger.wandb.mode=disabled",
    "data.train_tokens=262144", "data.n_heldout=64", "data.eval_docs=32", "data.docs_per_batch=8",
    "ctx=64", "trainer.num_threads=2", "optim.warmup_steps=2",
]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def import_script():
    """import_script("bench_attention") or import_script("gpu/ab_switch") -> that module of scripts/, imported with
    scripts/ and the script's own folder on sys.path for the duration of the import (the scripts import each other
    by bare name)."""
    def _import(path: str):
        dirs = list(dict.fromkeys([str(REPO / "scripts"), str((REPO / "scripts" / path).parent)]))
        sys.path[:0] = dirs
        try:
            return importlib.import_module(Path(path).name)
        finally:
            del sys.path[:len(dirs)]
    return _import


@pytest.fixture(scope="session")
def tiny_overrides() -> tuple[str, ...]:
    """TINY for fixtures shared by a module or the whole test run (`from conftest import` would find
    tests/data/conftest.py)."""
    return tuple(TINY)


@pytest.fixture
def tiny():
    """Overrides (a list) that make the real default run small enough for the CPU test suite."""
    return list(TINY)


@pytest.fixture
def make_corpus():
    """make_corpus(folder, files=16, words=60, seed=0, vocab=...) -> the folder, holding `files` text files of random
    words: a small input for scripts/prepare_dataset.py."""
    import numpy as np

    def make(folder: Path, files: int = 16, words: int = 60, seed: int = 0,
             vocab=("power", "attention", "state", "context")) -> Path:
        folder.mkdir(parents=True)
        rng = np.random.default_rng(seed)
        for i in range(files):
            (folder / f"{i}.txt").write_text(" ".join(rng.choice(list(vocab), words)))
        return folder
    return make


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One dataset cache for the whole test run (generated once, on first use)."""
    return tmp_path_factory.mktemp("longctx_cache")


def compose_config(data_cache, *overrides: str):
    """The real conf/ config, as train.py would see it, with the test run's dataset cache."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=[f"cache_dir={data_cache}", *overrides])


@pytest.fixture
def compose(data_cache):
    """compose(*overrides) -> the real conf/ config, as train.py would see it (run_dir set by the caller)."""
    return lambda *overrides: compose_config(data_cache, *overrides)


@pytest.fixture(scope="session")
def train_run(data_cache):
    """train_run(run_dir, overrides) -> run_dir, after the real Trainer trained there (for module fixtures)."""
    from longctx.train.trainer import Trainer

    def _train(run_dir: Path, overrides) -> Path:
        Trainer(compose_config(data_cache, *overrides, f"run_dir={run_dir}")).fit()
        return run_dir

    return _train


@pytest.fixture
def train_env(data_cache):
    """Environment for running train.py in a subprocess (CPU, the test run's dataset cache)."""
    env = dict(os.environ)
    env["LONGCTX_CACHE"] = str(data_cache)
    env["WANDB_SILENT"] = "true"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _drop_leaked_root_handlers() -> None:
    """Root-logger handlers that a library configured during an earlier test (Hydra's job logging, ...) and that
    write to a stream pytest has closed since; pytest's own capture handlers stay."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)


@pytest.fixture(autouse=True)
def fresh_logging():
    """Each test starts with logging as a new process has it: a handler a test left behind (a bar's redirection, a
    run's console, a library's root handler) would write to a stream pytest has closed since."""
    from longctx.train.console import close_logging

    close_logging()
    _drop_leaked_root_handlers()
    yield
    close_logging()
    _drop_leaked_root_handlers()


_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def fresh_torch_numerics():
    """Each test starts with torch's process-wide numerics as a new process has them: a Trainer built in-process
    sets the thread count (trainer.num_threads) and flushes denormals on CPU, which would otherwise carry into the
    tests an xdist worker runs after it (other summation blockings, tiny values read as zero)."""
    yield
    torch.set_num_threads(_THREADS)
    torch.set_flush_denormal(False)


@pytest.fixture(autouse=True)
def no_data_wait_warning(request, monkeypatch):
    """The trainer's data-wait warning follows the machine's load: on a loaded machine the tiny dataset's reader can
    lag the tiny model's steps past the 10% threshold, and a test counting a run's messages would see one more at
    random. Off for in-process runs, but in the tests of the warning itself (test_data_wait.py)."""
    if request.module.__name__.rpartition(".")[2] != "test_data_wait":
        monkeypatch.setattr(importlib.import_module("longctx.train.trainer"), "DATA_WAIT_WARN", float("inf"))
