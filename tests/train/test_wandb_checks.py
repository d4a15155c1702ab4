"""The wandb run id (wandb's own generator, kept across launches) and the online mode's key check."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from longctx.train.loggers import check_wandb, has_wandb_key, wandb_id_for

REPO = Path(__file__).resolve().parents[2]


def test_the_id_is_wandbs_and_kept_for_every_launch(tmp_path):
    first = wandb_id_for(tmp_path)
    assert re.fullmatch(r"[a-z0-9]{8}", first)
    assert wandb_id_for(tmp_path) == first == (tmp_path / "wandb_id").read_text().strip()
    assert wandb_id_for(tmp_path, "fromckpt") == first  # the file wins: one id from the first launch on
    other = tmp_path / "other"
    other.mkdir()
    assert wandb_id_for(other, "fromckpt") == "fromckpt"  # a checkpoint's id when the file was lost


def test_a_key_is_found_in_the_environment_or_netrc(tmp_path):
    none = {"NETRC": str(tmp_path / "missing")}
    assert not has_wandb_key(none)
    assert has_wandb_key({**none, "WANDB_API_KEY": "x" * 40})
    rc = tmp_path / "netrc"
    rc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    rc.chmod(0o600)
    assert has_wandb_key({"NETRC": str(rc)})
    assert not has_wandb_key({"NETRC": str(rc), "WANDB_BASE_URL": "https://wandb.example.org"})  # another host


def test_online_without_a_key_is_one_line_and_nothing_written(train_env, tmp_path):
    logger = OmegaConf.create({"wandb": {"mode": "online"}})
    with pytest.raises(ValueError, match=r"^config: logger.wandb.mode='online': no wandb API key"):
        check_wandb(logger, {"NETRC": str(tmp_path / "missing")})
    check_wandb(OmegaConf.create({"wandb": {"mode": "offline"}}), {})  # offline needs none
    env = {k: v for k, v in train_env.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), NETRC=str(tmp_path / "missing"))
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "logger.wandb.mode=online",
                          f"hydra.run.dir={tmp_path / 'run'}", f"cache_dir={train_env['LONGCTX_CACHE']}"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: config: logger.wandb.mode='online': no wandb API key (WANDB_API_KEY, or `wandb login`); log in, or "
        "use logger.wandb.mode=offline and `wandb sync` later"]
    assert not (tmp_path / "run").exists()
