"""Under bf16 autocast (the trainer's precision on CUDA) every architecture hands its attention core q, k and v in
bf16: cores that take their inputs' dtype (power, linear, window) would otherwise run their fp32 kernels (power p=2
with GPT-2's token shift once got fp32 inputs from an fp32 bias and trained 5x slower)."""
import pytest
import torch

from longctx.models import build_model
from _checks import VOCAB, model_cases, tiny_spec


def with_token_shift(case) -> bool:
    try:  # an architecture's own option (GPT-2's): the spec says which accept it
        tiny_spec(case.values[0], attention=case.values[1], token_shift=True)
        return True
    except ValueError:
        return False


CASES = ([pytest.param(*case.values, False, id=case.id) for case in model_cases()]
         + [pytest.param(*case.values, True, id=f"{case.id}-token_shift") for case in model_cases()
            if with_token_shift(case)])


@pytest.mark.parametrize("arch, attention, shift", CASES)
def test_attention_core_inputs_follow_autocast(arch, attention, shift):
    torch.manual_seed(0)
    kw = dict(token_shift=True) if shift else {}
    model = build_model(tiny_spec(arch, attention=attention, **kw))
    seen = []
    cores = [m.core for m in model.modules() if isinstance(getattr(m, "core", None), torch.nn.Module)]
    assert len(cores) == model.spec.n_layers
    for core in cores:
        core.register_forward_pre_hook(lambda mod, args: seen.append([a.dtype for a in args[:3]]))
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, x, reduction="sum").backward()
    assert len(seen) == model.spec.n_layers
    assert all(dt == torch.bfloat16 for layer in seen for dt in layer), seen
