"""Hugging Face transformers interop: longctx models as `LongctxConfig` / `LongctxForCausalLM` (model_type
"longctx"), registered with transformers' Auto classes on import, so an exported folder (`python -m longctx.export`)
loads with `AutoModelForCausalLM.from_pretrained(folder)` wherever longctx is installed. Needs the `hf` extra
(`pip install 'longctx[hf]'`); without it importing this package raises one line naming it."""
from longctx.hf.configuration import LongctxConfig
from longctx.hf.modeling import LongctxCache, LongctxForCausalLM
from transformers import AutoConfig, AutoModelForCausalLM

AutoConfig.register(LongctxConfig.model_type, LongctxConfig, exist_ok=True)
AutoModelForCausalLM.register(LongctxConfig, LongctxForCausalLM, exist_ok=True)

__all__ = ["LongctxCache", "LongctxConfig", "LongctxForCausalLM"]
