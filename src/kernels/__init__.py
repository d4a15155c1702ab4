"""Attention ops: Triton kernels for CUDA tensors, pure-PyTorch references for CPU tensors."""
from .power import (PowerState, default_chunk_size, power_attention, power_attention_step, power_decode_step,
                    power_state_step, state_dim, symmetric_power_indices)

__all__ = ["power_attention", "power_attention_step", "PowerState", "state_dim", "default_chunk_size",
           "power_decode_step", "power_state_step", "symmetric_power_indices"]
