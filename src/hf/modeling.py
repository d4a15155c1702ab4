"""`LongctxForCausalLM`: any longctx model (built from the config's ModelSpec, so every registered architecture and
attention) as a transformers causal LM, and `LongctxCache`, the transformers Cache that `generate` threads through
it.

The network is `build_model(config.spec())` itself under `self.model`: same modules, same weights, same forward,
so the logits are longctx's. Decoding keeps what each layer keeps in longctx (models/decoding.py): a KV cache for
exp, the rolling window for window, the constant-size state for power and linear, RWKV7's state and token-shift
inputs, in the per-layer `LayerCache`s that `LongctxCache` holds; each call feeds only the new tokens (transformers'
`generate` slices them off for a model with a cache), continuing those states, never recomputing the prefix.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from longctx.hf.configuration import LongctxConfig
from longctx.models import build_model
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

# transformers 5 names the cache `cache` (`past_key_values` before; still accepted as an alias)
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class LongctxCache(Cache):
    """The decoding state of a longctx model in transformers' Cache interface: one `LayerCache` per layer
    (`layer_caches`, the list `model.new_cache()` makes), updated in place by each forward. Its length is the tokens
    consumed. Not compileable, not croppable (assisted decoding is refused); beam search reorders it."""

    def __init__(self, layer_caches: list):
        super().__init__(layers=[])  # transformers' per-layer K/V objects are not used: the LayerCaches are the state
        self.layer_caches = list(layer_caches)

    def __len__(self) -> int:
        return len(self.layer_caches)

    def __getitem__(self, i: int):
        return self.layer_caches[i]

    def __repr__(self) -> str:
        return f"LongctxCache(layers={len(self.layer_caches)}, tokens={self.get_seq_length()})"

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.layer_caches[layer_idx].pos) if self.layer_caches else 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # no fixed length: a KV cache grows, the other states are of constant size

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.get_seq_length() > 0

    def reset(self) -> None:
        for layer in self.layer_caches:
            layer.pos, layer.state, layer.shift = 0, None, {}

    def _unsupported(self, what: str):
        raise NotImplementedError(f"LongctxCache: {what} is not supported (longctx states are per-attention objects); "
                                  f"use greedy decoding, sampling or beam search")

    def crop(self, tokens_to_remove: int) -> None:
        self._unsupported("crop (assisted decoding)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: every row of every layer's state taken from row beam_idx[i] (every state tensor, KV caches,
        recurrent states and token-shift inputs alike, holds the batch in its first dimension)."""
        for layer in self.layer_caches:
            layer.state = _take_rows(layer.state, beam_idx)
            layer.shift = {k: _take_rows(v, beam_idx) for k, v in layer.shift.items()}

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._unsupported("batch_repeat_interleave (expanding a filled cache)")

    def batch_select_indices(self, indices) -> None:
        self._unsupported("batch_select_indices")


def _take_rows(value, rows: torch.LongTensor):
    """`value` (a tensor, or a state object, tuple, list or dict holding tensors) with each tensor's first dimension
    indexed by `rows`; objects are updated in place, other values returned as they are."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows.to(value.device)) if value.dim() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple state (power's)
        return type(value)(*(_take_rows(v, rows) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_take_rows(v, rows) for v in value)
    if isinstance(value, dict):
        return {k: _take_rows(v, rows) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        for name, attr in vars(value).items():
            setattr(value, name, _take_rows(attr, rows))
    return value


def tied_parameters(model: nn.Module, prefix: str = "") -> dict[str, str]:
    """{name: name of the parameter it is}: each parameter reached under a second name (GPT-2's lm_head.weight is
    wte.weight), mapped to its first name."""
    first, tied = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[prefix + name] = first[id(param)]
        else:
            first[id(param)] = prefix + name
    return tied


class LongctxPreTrainedModel(PreTrainedModel):
    config_class = LongctxConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def _init_weights(self, module):
        pass  # the longctx model initialises its own weights when built; loaded weights replace them

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loading, refusing a folder whose weights file lacks some of the model's tensors (a damaged
        or partial export): transformers would load it anyway, those tensors left as uninitialised memory (NaN
        logits scored as results)."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            where = args[0] if args else kwargs.get("pretrained_model_name_or_path")
            raise ValueError(f"{where}: its weights lack {len(missing)} of the model's tensors, the first "
                             f"{missing[0]} (a damaged or partial export); export the run again")
        return (model, info) if want_info else model


class LongctxForCausalLM(LongctxPreTrainedModel, GenerationMixin):
    """A longctx model as a transformers causal LM (see the module docstring). forward(input_ids, attention_mask,
    cache, use_cache, labels, logits_to_keep): logits (b, t, vocab); with use_cache=True (generate's) or a cache, the
    input continues the cache's tokens and the cache is returned. attention_mask may only mark right padding of a
    forward without a cache (a causal model's real positions never see the pads after them): left padding would need
    masking inside the recurrent states, which longctx's cores do not do, and is refused."""

    def __init__(self, config: LongctxConfig):
        super().__init__(config)
        self.model = build_model(config.spec())
        tied = tied_parameters(self.model, "model.")
        self._tied_weights_keys = tied or None       # stored once in model.safetensors, tied again when loaded
        config.tie_word_embeddings = bool(tied)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the forward makes its own LongctxCache (generate would otherwise hand it a DynamicCache)

    def get_input_embeddings(self) -> nn.Module:
        return next(m for m in self.model.modules() if isinstance(m, nn.Embedding))

    def get_output_embeddings(self) -> nn.Module | None:
        return getattr(self.model, "lm_head", None)

    def new_cache(self) -> LongctxCache:
        return LongctxCache(self.model.new_cache())

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                cache: LongctxCache | None = None, use_cache: bool | None = None,
                labels: torch.LongTensor | None = None, return_dict: bool | None = None, logits_to_keep: int = 0,
                inputs_embeds: torch.Tensor | None = None, past_key_values: LongctxCache | None = None, **kwargs):
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("LongctxForCausalLM: give input_ids (inputs_embeds is not supported)")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, LongctxCache):
            raise ValueError(f"cache: a {type(cache).__name__}; a longctx model keeps its state in a LongctxCache "
                             f"(made by generate, by forward(use_cache=True) or by model.new_cache())")
        if cache is None and use_cache:
            cache = self.new_cache()
        if attention_mask is not None:
            check_mask(attention_mask, cached=cache is not None)
        check_extras(kwargs, start=0 if cache is None else cache.get_seq_length(), length=input_ids.shape[1])
        last = logits_to_keep if isinstance(logits_to_keep, int) and logits_to_keep > 0 else False
        logits = self.model(input_ids, cache=None if cache is None else cache.layer_caches, last_only=last)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs; position i predicts label i + 1
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})
        return out if return_dict is not False else out.to_tuple()


def check_extras(kwargs: dict, start: int, length: int) -> None:
    """transformers' other forward arguments: position_ids only as the positions the cache continues from (longctx
    places tokens itself), no attention maps or hidden states (not kept); ValueError naming the argument else."""
    positions = kwargs.pop("position_ids", None)
    if positions is not None:
        expected = torch.arange(start, start + length, device=positions.device)
        if positions.shape[-1] != length or not bool((positions == expected).all()):
            raise ValueError(f"position_ids: only positions {start}..{start + length - 1} (the tokens after the "
                             f"cache's) are supported")
    for name in ("output_attentions", "output_hidden_states"):
        if kwargs.pop(name, None):
            raise ValueError(f"{name}=True: not supported by longctx models")
    kwargs.pop("cache_position", None)  # the cache knows its position


def check_mask(mask: torch.Tensor, cached: bool) -> None:
    """Every position attended, or (without a cache) rows of ones then zeros: ValueError otherwise."""
    if bool(mask.all()):
        return
    right_padded = mask.dim() == 2 and bool((mask[:, 1:] <= mask[:, :-1]).all())
    if cached or not right_padded:
        raise ValueError("attention_mask: padding other than on the right of a forward without a cache is not "
                         "supported (longctx's recurrent and windowed states do not mask); run prompts one at a "
                         "time or of equal length")
