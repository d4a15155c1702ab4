"""Hugging Face transformers interop: longctx models as `LongctxConfig` / `LongctxForCausalLM` (model_type
"longctx"), registered with transformers' Auto classes on import, so an exported folder (`python -m longctx.export`)
loads with `AutoModelForCausalLM.from_pretrained(folder)` wherever longctx is installed. Needs the `hf` extra
(`pip install 'longctx[hf]'`); without it importing this package raises one line naming it."""
import sys

try:
    from longctx.hf.configuration import LongctxConfig
    from longctx.hf.modeling import LongctxCache, LongctxForCausalLM
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as err:
    if sys.argv[:1] == ["-m"]:   # `python -m longctx.hf.<command>` (argv[0] is "-m" while runpy finds it): one line
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    raise

AutoConfig.register(LongctxConfig.model_type, LongctxConfig, exist_ok=True)
AutoModelForCausalLM.register(LongctxConfig, LongctxForCausalLM, exist_ok=True)

__all__ = ["LongctxCache", "LongctxConfig", "LongctxForCausalLM"]
