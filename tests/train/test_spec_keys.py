"""The config-key names the trainer's checkpoint errors use belong to fields ModelSpec has."""
import dataclasses

from longctx.models import ModelSpec
from longctx.train.trainer import SPEC_KEYS


def test_every_spec_key_names_a_field():
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    assert set(SPEC_KEYS) <= fields, sorted(set(SPEC_KEYS) - fields)
