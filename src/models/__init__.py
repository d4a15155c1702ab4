"""Architectures (GPT-2, RWKV7) with a swappable attention core: `build_model(ModelSpec(...))`."""
from .attention import ATTENTIONS, build_attention
from .spec import ModelSpec

__all__ = ["ATTENTIONS", "ModelSpec", "build_attention", "build_model"]


def build_model(spec: ModelSpec):
    """ModelSpec -> nn.Module with forward(input_ids, targets=None, cache=None), generate(...),
    flops_per_token(ctx), state_size(ctx)."""
    if spec.arch == "gpt2":
        from .gpt2 import GPT2
        return GPT2(spec)
    if spec.arch == "rwkv7":
        from .rwkv7 import RWKV7
        return RWKV7(spec)
    raise ValueError(f"ModelSpec.arch={spec.arch!r}: unknown architecture")
