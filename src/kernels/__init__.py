"""Attention ops: Triton kernels for CUDA tensors, pure-PyTorch references for CPU tensors."""
from .power import PowerState, default_chunk_size, power_attention, power_attention_step, state_dim

__all__ = ["power_attention", "power_attention_step", "PowerState", "state_dim", "default_chunk_size"]
