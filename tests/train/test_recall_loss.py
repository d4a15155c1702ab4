"""data.loss_on=queries (MQAR's default): the training loss is the mean NLL of the queried values alone, all other
targets ignored, as zoology's labels; other datasets, or rows cut by data.reshape_block, are refused naming the key."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longctx.data.mqar import IGNORE
from longctx.train.config import validate
from longctx.train.trainer import Trainer

RECALL = ("experiment=recall_state_cpu", "+experiment/arm=exp")


@pytest.mark.parametrize("overrides", [("data=mqar", "data.loss_on=values"), ("data=mqar", "data.loss_on=3"),
                                       ("data=mqar", "data.reshape_block=16")])
def test_bad_loss_on_names_the_key(compose, overrides):
    with pytest.raises(ValueError, match="config: data[.]loss_on="):
        validate(compose(*overrides))


def test_loss_on_is_a_recall_data_key(compose):
    with pytest.raises(ValueError, match="data[.]loss_on"):
        validate(compose("+data.loss_on=queries"))  # data=icl_markov has no query positions


@pytest.mark.parametrize("loss_on", ["queries", "all"])
def test_the_step_loss_is_the_mean_nll_of_the_counted_targets(compose, tmp_path, loss_on):
    trainer = Trainer(compose(*RECALL, f"data.loss_on={loss_on}", "trainer.micro_docs=1", f"run_dir={tmp_path}"))
    batch = next(iter(trainer.reader))
    targets = batch["targets"]
    counted = targets != IGNORE
    cfg = trainer.cfg.data
    if loss_on == "queries":  # exactly one target per query, each a value id after the pairs
        assert counted.sum() == cfg.docs_per_batch * cfg.n_pairs
        assert counted[:, :2 * cfg.n_pairs].sum() == 0
        assert ((targets[counted] >= cfg.n_keys) & (targets[counted] < cfg.n_keys + cfg.n_values)).all()
    else:
        assert counted.all()
    model = trainer.model.double()
    with torch.no_grad():
        logits = model(batch["inputs"])
    expected = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE).item()  # mean over counted
    trainer.model.float()
    assert trainer.train_step(batch) == pytest.approx(expected, rel=1e-5)
