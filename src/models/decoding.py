"""Autoregressive generation: a static decoder (the default), per-layer caches, or recomputing the whole prefix.

Three paths, each the check of the next:
- recompute (`use_cache=False`): every step a full forward over the sequence so far; slow, the independent truth.
- cached (`static=False`): the prompt runs once through `model(prompt, cache=caches)` and every new token is one
  call with a single position; each layer keeps what its attention needs to continue (models/attention/: a KV cache
  for exp, the rolling window for window, the constant-size recurrent state for power/linear; RWKV7 adds its
  token-shift inputs and its own recurrent state), in tensors that each call replaces.
- static (`StaticDecoder`, the default): the prompt as in the cached path (the chunked kernels return power's final
  state), then every cache moved into buffers allocated once (a KV cache of the whole length, a ring of the window,
  the recurrent states) that a one-token step updates in place, with the position a device tensor. Nothing in a
  step depends on the host, so on CUDA the whole step (every layer and the LM head) is captured once as a CUDA
  graph and replayed per token; sampling runs on the device after it, and nothing syncs until the end. On CUDA the
  fast path is the default: every layer's step compiled before the capture (a failed compilation falls back on
  the plain step, with a warning); power's state is updated by its fused kernel, one launch a layer (kernels/power/
  decode_kernel.py; `StaticDecoder(fused=False)`: the plain-torch step, compiled with the rest). On CPU the same step runs eagerly
  (tests/models/test_decoding.py checks it token for token against recomputation).
"""
from __future__ import annotations

import copy
import importlib.util
import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn as nn


@dataclass
class LayerCache:
    """One layer's decoding state."""
    pos: int = 0                                  # tokens consumed: the position (rotary offset) of the next one
    state: object = None                          # the attention core's own state (None before the first token)
    shift: dict = field(default_factory=dict)     # the architecture's extras (RWKV7: its token-shift inputs)
    # StaticDecoder's: buffers written in place; pos one 0-dim device tensor shared by every layer, advanced once a
    # step by the decoder (not by each layer: one kernel a token instead of one a layer)
    static: bool = False


def sample_next(logits: torch.Tensor, temperature: float, top_k: int | None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(b, vocab) logits -> (b, 1) next ids: greedy (argmax) when temperature is 0, else a sample from
    softmax(logits / temperature), restricted to the top_k most likely ids when top_k is set."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


def check_generate_args(model, idx, max_new_tokens, temperature, top_k) -> None:
    """ValueError naming the argument for every bad input (token ids outside the vocabulary included)."""
    vocab = model.spec.vocab_size
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"idx must be a (batch, seq) integer tensor, got "
                         f"{tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__}")
    if idx.shape[1] < 1:
        raise ValueError("idx must hold at least one token (the prompt)")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab):
        bad = int(idx.max()) if int(idx.max()) >= vocab else int(idx.min())
        raise ValueError(f"idx: token id {bad} is outside the model's vocabulary 0..{vocab - 1}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if (not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not math.isfinite(temperature)
            or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive integer, got {top_k!r}")
    check_positions(model, idx.shape[1], max_new_tokens)


def check_positions(model, prompt_len: int, max_new_tokens: int, prompt_flag: str = "idx",
                    new_flag: str = "max_new_tokens") -> None:
    """Learned positions end at the model's ctx: a sequence past it is refused before any decoding, on every path
    alike (the static decoder's position is a device tensor, which the embedding would read past its table). The
    last new token is never fed back, so the model reads prompt_len + max_new_tokens - 1 positions. The flags name
    the arguments in the message (the CLI's --prompt-ids / --max-new-tokens)."""
    ctx, need = int(model.spec.ctx), prompt_len + max_new_tokens - 1
    if model.spec.positions != "learned" or need <= ctx:
        return
    if prompt_len > ctx:
        raise ValueError(f"{prompt_flag}: {prompt_len} tokens need positions up to {prompt_len}: "
                         f"arch.positions=learned holds ctx={ctx} positions; give a shorter prompt")
    raise ValueError(f"{new_flag}={max_new_tokens}: a prompt of {prompt_len} tokens and {max_new_tokens} new "
                     f"ones need positions up to {need}: arch.positions=learned holds ctx={ctx} positions; ask for at "
                     f"most {ctx - prompt_len + 1}")


def autocast_weights(model: nn.Module) -> nn.Module:
    """The model as autocast runs it: a copy whose Linear weights and biases are already in the autocast dtype
    (autocast would cast them again at every step: in a CUDA graph a cast kernel per weight, twice the weight
    traffic), the rest (embeddings, norms, gates) untouched. Same numbers as the model under the caller's autocast;
    the model itself when autocast is off."""
    device = next(model.parameters()).device
    if not torch.is_autocast_enabled(device.type):
        return model
    dtype = torch.get_autocast_dtype(device.type)
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if isinstance(module, nn.Linear):  # a tied LM head gets its own cast copy; the embedding stays as it was
            module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
            if module.bias is not None:
                module.bias = nn.Parameter(module.bias.detach().to(dtype), requires_grad=False)
    return twin.requires_grad_(False)


class RowLinear(nn.Linear):
    """nn.Linear whose one-row input (batch 1, one position: a decoding step) is multiplied by torch.mm: the same
    x W^T + b. Compiled with COMPILE_OPTIONS' coordinate-descent tuning, inductor writes the mm of one row as a
    tuned Triton reduction (its decomposition of a one-row mm) with the bias and what follows (GELU, the residual
    add) fused into it, in place of a cuBLAS GEMV launch (split-K and a reduce for the MLP's output projection)
    and separate bias and activation kernels. Other inputs take nn.Linear's own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return super().forward(x)
        y = torch.mm(x.reshape(1, -1), self.weight.t())
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)        # the matmul's dtype, as F.linear's bias under autocast
        return y.view(*x.shape[:-1], -1)


# inductor options of the compiled one-token step: coordinate-descent tuning of every Triton kernel's launch shape,
# which also turns a one-row mm into a tuned reduction (RowLinear)
COMPILE_OPTIONS = {"coordinate_descent_tuning": True}


def compile_available(device: torch.device) -> bool:
    """Whether the decoding step is compiled by default on `device`: CUDA, with TorchDynamo supported on this Python
    and Triton installed (inductor's CUDA backend). Elsewhere the static step runs uncompiled: on CPU compiling costs
    more than it saves for the tiny models run there."""
    device = torch.device(device)
    return (device.type == "cuda" and torch._dynamo.is_dynamo_supported()
            and importlib.util.find_spec("triton") is not None)


def takes_fused_state(model: nn.Module) -> bool:
    """Whether the static decoder of `model` updates power states, which CUDA does with the fused kernel: power
    attention, and linear attention (power of degree 1) where it is not an architecture's native mixing."""
    from longctx.models.attention.power import PowerAttention
    return any(isinstance(m, PowerAttention) for m in model.modules())


class StaticDecoder:
    """Decoding with every layer's state in buffers allocated once, one token per step; on CUDA each step is a
    replay of one captured CUDA graph.

        decoder = StaticDecoder(model, capacity=prompt_len + new_tokens)
        logits = decoder.prefill(prompt)          # (b, vocab): the prompt's last position
        logits = decoder.step(next_ids)           # (b, vocab): next_ids (b, 1) fed at the next position

        decoder = StaticDecoder(model, capacity=prompt_len + new_tokens, greedy=True)
        first = decoder.prefill(prompt).argmax(-1, keepdim=True)
        tokens = decoder.greedy(n, first=first)   # (b, n): the n tokens after `first`, each chosen in its step

    capacity: the most positions the sequence will hold (the KV cache's length; power/linear/RWKV7 states do not
    grow); a step past it is refused. graphs: capture the step on CUDA after `warmup` eager steps (which compile and
    autotune the kernels); a capture that fails is reported (`graph_error`, a warning) and the same step runs
    eagerly. compile: torch.compile the one-token step before the capture; seconds of compilation in the first step.
    None (the default): on CUDA where it can (`compile_available`), not on CPU. A compilation that fails is reported
    (`compile_error`, a warning), the buffers are restored and the plain step runs. compile_scope: "model" (the
    default: the whole one-token forward as one graph, embedding and LM head included, so a block's last residual
    add fuses with the next one's norm; 1.05-1.07x the tokens/s of "blocks" for GPT-2 small power p=2 at batch 1
    on an H200) or "blocks" (each residual block compiled, one graph reused by every layer; quicker to build). fused:
    power attention's state updated by its fused kernel on CUDA (one launch a layer; the default, 1.25x the compiled
    plain step's tokens/s at batch 1 on an H200); False: the plain-torch step, compiled with the rest. row_gemv:
    when compiled, the decoder's copy runs its linear layers as `RowLinear` (a one-row input through torch.mm, which
    inductor fuses with bias and activation as a reduction); the caller's model keeps its own. compile_options:
    inductor's options for the compiled step (None: COMPILE_OPTIONS, coordinate-descent tuning; {}: torch's
    defaults). Either alone gains ~1% over cuBLAS's GEMV; together they give 1.14x the tokens/s of GPT-2 small power
    p=2 at batch 1 on an H200 (the reductions tuned to the card). greedy: every
    step also takes its logits' argmax as the next input and records it, inside the step (so inside its CUDA graph:
    between two tokens nothing is launched but the replay); `greedy(n)` runs n such steps. The returned logits are a
    buffer the next step overwrites. Runs under the caller's autocast (bf16 on GPU).
    """

    def __init__(self, model: nn.Module, capacity: int, graphs: bool = True, warmup: int = 2,
                 compile: bool | None = None, fused: bool = True, compile_scope: str = "model", greedy: bool = False,
                 row_gemv: bool = True, compile_options: dict | None = None):
        if compile_scope not in ("blocks", "model"):
            raise ValueError(f"compile_scope={compile_scope!r}: expected 'blocks' or 'model'")
        self.compile_scope, self.compiled_forward = compile_scope, None
        self.compile_options = dict(COMPILE_OPTIONS if compile_options is None else compile_options)
        self.model = autocast_weights(model.eval())
        self.device = next(model.parameters()).device
        self.compile = compile_available(self.device) if compile is None else compile
        self.fused, self.use_greedy = fused, greedy
        if self.compile and self.model is model:  # compiled blocks belong to the decoder's copy, never the caller's
            self.model = copy.deepcopy(model)
        self.row_gemv = row_gemv and self.compile
        if self.row_gemv:  # the decoder's own copy (autocast_weights' or the deepcopy above), never the caller's
            for module in self.model.modules():
                if type(module) is nn.Linear:
                    module.__class__ = RowLinear
        self.capacity, self.warmup = capacity, warmup
        self.use_graphs = graphs and self.device.type == "cuda"
        self.graph = self.graph_error = self.compile_error = None
        self.cache = self.ids = self.logits = self.pos = None
        self.tokens = self.written = None            # greedy: the chosen ids (b, room) and how many (1,), on device
        self.eager_steps = self.steps = self.room = 0

    @property
    def mode(self) -> str:
        """'cuda-graph' once the step is captured, else 'eager' (CPU, warm-up steps, or a failed capture)."""
        return "cuda-graph" if self.graph is not None else "eager"

    def describe(self) -> str:
        """The path the steps take, in words: 'static buffers, compiled step, fused power kernel, CUDA graphs'."""
        parts = ["static buffers"]
        if self.compile:
            parts.append("compiled step" if self.compile_scope == "blocks" else "compiled model step")
        if self.fused and self.device.type == "cuda" and any(hasattr(c.state, "fused") for c in self.cache or []):
            parts.append("fused power kernel")
        if self.graph is not None:
            parts.append("CUDA graphs")
        return ", ".join(parts)

    @torch.no_grad()
    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Run the prompt idx (b, t) and move every layer's state into static buffers -> (b, vocab) logits."""
        if idx.shape[1] >= self.capacity:
            raise ValueError(f"capacity={self.capacity} leaves no room after a prompt of {idx.shape[1]} tokens")
        cache = self.model.new_cache()
        logits = self.model(idx, cache=cache, last_only=True)[:, -1]
        cores = [m for m in self.model.modules() if hasattr(m, "static_state")]  # one per layer, in layer order
        assert len(cores) == len(cache), (len(cores), len(cache))
        self.pos = torch.tensor(idx.shape[1], dtype=torch.int64, device=self.device)
        assert all(layer.pos == idx.shape[1] for layer in cache), [layer.pos for layer in cache]
        for layer, core in zip(cache, cores):
            layer.pos = self.pos
            layer.state = core.static_state(layer.state, layer.pos, self.capacity)
            if hasattr(layer.state, "fused"):  # power/linear: the fused kernel or the plain-torch step
                layer.state.fused = self.fused
            layer.static = True
        self.cache, self.ids = cache, idx.new_zeros(idx.shape[0], 1)
        self.steps, self.room = 0, self.capacity - idx.shape[1]
        if self.use_greedy:
            self.tokens = idx.new_zeros(idx.shape[0], self.room)
            self.written = torch.zeros(1, dtype=torch.int64, device=self.device)
            if self.compile and self.room > 1:  # the one shape a constant-state decoder of another length changes:
                torch._dynamo.mark_dynamic(self.tokens, 1)  # symbolic, so such decoders share one compiled step
        if self.compile:  # after the prompt: only the one-token step runs compiled
            self._set_compiled(True)
        return logits

    def _set_compiled(self, on: bool) -> None:
        # dynamic=False: a decoder of another length (another KV cache shape) gets kernels specialized to it; with
        # torch's default a second shape would recompile the step as shape-generic kernels for every later length
        if self.compile_scope == "model":
            self.compiled_forward = torch.compile(self._plain_forward, dynamic=False,
                                                  options=self.compile_options) if on else None
            return
        for block in self.model.residual_blocks:
            if on:
                block.compile(dynamic=False, options=self.compile_options)
            else:
                block._compiled_call_impl = None  # what nn.Module.compile set: back to the plain forward

    def _buffers(self) -> list[torch.Tensor]:
        """Every tensor a step writes (the position, states, KV caches, token-shift inputs; greedy: ids and tokens)."""
        out = [self.pos]
        for layer in self.cache:
            out += [*layer.shift.values()]
            out += [t for t in vars(layer.state).values() if isinstance(t, torch.Tensor)]
        return out + ([self.ids, self.tokens, self.written] if self.use_greedy else [])

    def _plain_forward(self) -> torch.Tensor:
        logits = self.model(self.ids, cache=self.cache)[:, -1]                 # (b, vocab)
        self.pos += 1                                        # every layer's position: the layers leave it to us
        if self.use_greedy:  # the next input chosen and recorded on the device, in the step's own graph
            nxt = logits.argmax(-1, keepdim=True)
            self.ids.copy_(nxt)
            self.tokens.index_copy_(1, self.written, nxt)
            self.written += 1
        return logits

    def _forward(self) -> torch.Tensor:
        return (self.compiled_forward or self._plain_forward)()

    @torch.no_grad()
    def step(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ids (b, 1) at the next position -> (b, vocab) logits (a buffer the next step overwrites); ids None
        (greedy=True only): the previous step's argmax, already in place."""
        if self.cache is None:
            raise ValueError("step() before prefill(): the decoder holds no prompt yet")
        if self.steps >= self.room:
            raise ValueError(f"capacity={self.capacity} is full: the prompt and {self.steps} steps fill it")
        if ids is None:
            if not self.use_greedy:
                raise ValueError("step(ids=None) continues from the previous argmax: only StaticDecoder(greedy=True)")
        else:
            self.ids.copy_(ids)
        self.steps += 1
        if self.graph is None and self.use_graphs and self.graph_error is None and self.eager_steps >= self.warmup:
            self._capture()
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        self.eager_steps += 1
        if self.compile and self.eager_steps == 1:
            return self._first_compiled_step()
        return self._eager_step()

    @torch.no_grad()
    def greedy(self, n: int, first: torch.Tensor | None = None) -> torch.Tensor:
        """n greedy steps (greedy=True): the first fed `first` (b, 1) (None: the previous step's argmax), each later
        one its predecessor's argmax -> (b, n) the argmax of each step's logits, the tokens that follow `first`.
        Between two tokens the host launches only the step's replay and reads nothing back."""
        if not self.use_greedy:
            raise ValueError("greedy() needs StaticDecoder(greedy=True)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n={n!r}: expected a whole number of steps >= 0")
        start = self.steps
        for i in range(n):
            self.step(first if i == 0 else None)
        return self.tokens[:, start:start + n].clone()

    def _first_compiled_step(self) -> torch.Tensor:
        """The step that compiles: if compilation fails, the buffers it may have touched are restored and the plain
        step runs from then on."""
        saved = [(t, t.clone()) for t in self._buffers()]
        try:
            return self._eager_step()
        except Exception as err:  # noqa: BLE001 - any compiler failure: report it, decode uncompiled
            self.compile_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(f"compiling the decoding step failed ({self.compile_error}); decoding uncompiled",
                          RuntimeWarning, stacklevel=3)
            for tensor, copy_ in saved:
                tensor.copy_(copy_)
            self._set_compiled(False)
            self.compile = False
            return self._eager_step()

    def _eager_step(self) -> torch.Tensor:
        if self.device.type != "cuda":
            return self._forward()
        side = torch.cuda.Stream(self.device)       # warm-up steps on a side stream, as graph capture wants
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            logits = self._forward()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return logits

    def _capture(self) -> None:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = self._forward()                                       # recorded, not run
        except Exception as err:  # noqa: BLE001 - any failure: report it and decode eagerly instead
            self.graph_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(f"CUDA graph capture of the decoding step failed ({self.graph_error}); decoding with the "
                          f"same static buffers eagerly, without graphs", RuntimeWarning, stacklevel=3)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return
        self.graph, self.logits = graph, logits

    def state_bytes(self) -> int:
        """Bytes of every layer's decoding buffers (states, KV caches, token-shift inputs)."""
        total = 0
        for layer in self.cache or []:
            total += layer.state.nbytes() + sum(t.numel() * t.element_size() for t in layer.shift.values())
        return total


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             use_cache: bool = True, generator: torch.Generator | None = None, static: bool = True,
             compile: bool | None = None) -> torch.Tensor:
    """Continue idx (b, t) int64 by `max_new_tokens` tokens -> (b, t + max_new_tokens).

    temperature: softmax temperature; 0 = greedy (argmax). top_k: sample among the k most likely ids only.
    use_cache: decode with per-layer states (constant work per token for power/linear/window) instead of
    recomputing the whole prefix for every token. static: with use_cache, the StaticDecoder (preallocated buffers,
    CUDA graphs on CUDA; the default) instead of caches replaced at every call; compile: its one-token step
    compiled first (None, the default: on CUDA, where torch.compile is available; a failed compilation warns and
    decodes uncompiled; False: never, True: on CPU too). On CUDA power attention's state takes its fused
    kernel. generator: a torch.Generator for reproducible sampling. Runs
    under the caller's autocast, if any; the model is put in eval mode and left there. Sampling runs on the device:
    nothing waits for the host until the end; greedy decoding on the static path chooses each token inside its
    step (StaticDecoder(greedy=True)), so between tokens only the step's graph is launched.

    Example:
        >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=20, temperature=0)
    """
    check_generate_args(model, idx, max_new_tokens, temperature, top_k)
    model.eval()
    idx = idx.long()
    if max_new_tokens == 0:
        return idx
    if not use_cache:
        for _ in range(max_new_tokens):
            logits = model(idx, last_only=True)[:, -1]                   # the whole prefix, every token
            idx = torch.cat([idx, sample_next(logits, temperature, top_k, generator)], dim=1)
        return idx
    if static:
        decoder = StaticDecoder(model, capacity=idx.shape[1] + max_new_tokens, compile=compile,
                                greedy=temperature == 0)
        if temperature == 0:  # every token after the first chosen inside its step's graph
            first = sample_next(decoder.prefill(idx), 0, None)
            return torch.cat([idx, first, decoder.greedy(max_new_tokens - 1, first=first)], dim=1)
        prefill, step = decoder.prefill, decoder.step
    else:
        cache = model.new_cache()
        prefill = lambda ids: model(ids, cache=cache, last_only=True)[:, -1]  # noqa: E731
        step = lambda ids: model(ids, cache=cache)[:, -1]                     # noqa: E731
    logits = prefill(idx)                                               # the prompt, once
    out = [idx]
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)        # (b, 1)
        out.append(nxt)
        if i + 1 < max_new_tokens:
            logits = step(nxt)                                           # one position against the states
    return torch.cat(out, dim=1)
