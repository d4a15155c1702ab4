"""Power attention (Kerr et al., "Scaling Context Requires Rethinking Attention"): kernels + reference."""
from .interface import default_chunk_size, power_attention, power_attention_step
from .decode import power_decode_step, power_state_step, symmetric_power_indices
from .reference import PowerState, state_dim
from .context_parallel import context_parallel_power_attention, differentiable_all_gather, tie
from .parallel import fused_backward

__all__ = ["power_attention", "power_attention_step", "PowerState", "state_dim", "default_chunk_size",
           "power_decode_step", "power_state_step", "symmetric_power_indices", "context_parallel_power_attention",
           "differentiable_all_gather", "tie", "fused_backward"]
