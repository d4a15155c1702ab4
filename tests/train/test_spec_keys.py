"""The config-key names the trainer's checkpoint errors use belong to fields ModelSpec has, and a bad value of a model
key is named by its config key, not by ModelSpec's field."""
import dataclasses

import pytest
from omegaconf import OmegaConf

from longctx.models import ModelSpec
from longctx.models.spec import SPEC_KEYS, model_spec


def test_every_spec_key_names_a_field():
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert set(SPEC_KEYS) <= fields, sorted(set(SPEC_KEYS) - fields)


@pytest.mark.parametrize("key,value,message", [
    ("arch.rope_dims", 7, "arch.rope_dims=7: must be null (every head dim) or an even integer in [2, head_dim=32]"),
    ("model.n_layers", 0, "model.n_layers=0: must be a positive integer"),
    ("arch.rope_base", 1, "arch.rope_base=1: must be a number > 1"),
])
def test_a_bad_model_value_is_named_by_its_config_key(compose, tiny, key, value, message):
    cfg = compose(*tiny)
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ValueError) as err:
        model_spec(cfg, 8)
    assert str(err.value) == message
