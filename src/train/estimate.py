"""Memory and time of a run, estimated before anything is generated, read or allocated.

Peak memory of one rank (bytes):

    model    = 16 * parameters          fp32 weights 4 + gradients 4 + AdamW's two moments 8
    saved    = micro_docs * ctx * n_layers * a * bytes      activations kept for the backward
    logits   = 3 * min(micro_docs * ctx, 8192) * vocab * 4  one chunk of the fused loss (logits, softmax, grad)

`a`, the elements saved per token per layer, is `d_model * (c_arch + 2 * mlp_ratio)` (c_arch = 10 for GPT-2: the
two norms' inputs and outputs, q, k, v, the attention output and the projections' inputs; 19 for RWKV7 with its own
time mixing, 25 for RWKV7's blocks around an attention core (its mixes, rotary q and k, the r/k/v/gate/o projections'
inputs, the channel mixing's norm, mix and a third hidden tensor); 2 * mlp_ratio: the MLP's hidden pre- and
post-activation; Korthikanti et al. 2022 count the same tensors; Llama: 12 d_model + 4 d_ff, its SwiGLU keeping four
hidden tensors) plus what the attention form keeps: `n_heads * ctx * 5` for the attention form of the CPU
power/linear reference (scores, powers, normalizer over every key), `n_heads * 2 * window * 2` for the CPU window's
masked blocks, a chunked form's states (`state_size / chunk` per token), RWKV7's time mixing `46 * d_model` (CPU
chunked form) or `d_model` (FLA's chunk states). Under bf16 autocast the tensors it keeps in fp32 count twice
(`autocast_fp32`: the norms' inputs, RWKV7's mixes, group-norm input and squared-ReLU hidden, a gated core's gate
input, and under activation checkpointing each block's input). The constants were measured with
torch.autograd.graph.saved_tensors_hooks (tests/train/test_estimate.py checks them within 30% on CPU, and the CUDA
total against one measured bf16 step of GPT-2 and RWKV7 small at ctx 16384: with power p=2 on an H100, 15.65 GiB
estimated against a 15.70 GiB peak for GPT-2 and 28.07 against 29.66 for RWKV7). Softmax through SDPA (flash/cuDNN
on CUDA, the flash kernel on CPU) and FlexAttention keep no score matrix. `bytes` is 2 under bf16 autocast, else 4.
With activation checkpointing only each block's input is kept (`d_model` elements per token per layer) plus one
block's activations while it is recomputed. One layer's backward at a time also holds its transients
(`backward_transient`: the CUDA attention form's one-kernel backward keeps dq in fp32, `d_model` floats per token).

Context parallelism (trainer.context_parallel=N, docs/gpu.md (Context parallelism)): a rank holds micro_docs * ctx / N
tokens of activations, plus what its attention's exchange keeps for the backward, per document and layer (the
last rank's, the most): exp the gathered keys and values, 2 * d_model * ctx elements; window the halo,
2 * d_model * (window - 1); power / linear the N gathered states, N * state_size fp32 floats. The longest context
that fits N GPUs: `python -m longctx.train.estimate --gpus N --memory-gib M [config overrides]`.

Memory available: CUDA, 90% of the card's memory (the activation_checkpointing=auto probe's margin); CPU, the
host's available memory (/proc/meminfo MemAvailable).

An evaluation (`python -m longctx.evaluate`) runs forwards without gradients: the fp32 weights (+ their bf16 copies
under autocast), one block's activations of a micro-batch at a time, one loss chunk (`forward_memory`), and on the
host the token arrays it holds (heldout documents, or the retrieval prompts of one context).

Time: the steps left (to trainer.max_steps, or to the step trainer.flops_budget stops the run at when that comes
first: longctx.train.flops.budget_steps, the trainer's own rule; less a resumed run's checkpoint step) * tokens per
step * training FLOPs per token (longctx.train.flops) over an assumed rate:
CUDA, 35% of the card's bf16 peak (the README's measured MFUs are 25-42%); CPU, half this machine's fp32 matmul
rate measured at start (the default run reaches about that on 2 idle cores). On a CPU, power and linear attention run
the PyTorch reference, whose elementwise passes over each block's t x t scores take several times its matmuls (1.5 s
of a ~2 s step of `attention=power ctx=512` on 2 cores, whose FLOPs at the rate made ~0.25 s): the time it takes
beyond its FLOPs at the rate is measured at start, one layer of the run's micro-batch in the form that runs
(`cpu_reference_seconds`), and added. An estimate to catch the impossible, not a promise: a loaded machine takes
longer, so the trainer measures its first steps and says the time they make (trainer.py, MEASURED_STEPS). An
evaluation's time (`evaluation_line`): the forward FLOPs of the contexts it runs over the same rate, plus on a CPU the
reference's forward measured the same way.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch
from omegaconf import DictConfig

log = logging.getLogger("longctx")

GIB = 2 ** 30
ARCH_SAVED = {"gpt2": 10, "llama": 12, "rwkv7": 19}
RWKV7_AROUND_CORE = 25     # RWKV7's blocks around an attention core (attention=exp, window, power) instead of its rule
LOSS_CHUNK = 8192          # tokens per chunk of the fused loss (models.common.nll_sum's chunk_tokens)
CUDA_MFU, CPU_EFFICIENCY, CUDA_MEMORY_SHARE = 0.35, 0.5, 0.9
GPT2_VOCAB = 50257
# The CPU reference's time per score entry grows with the entries of one forward (10-30 ns forward and backward at
# t = 512 from 1M to 16M entries, 2 cores): it is timed on the run's own micro-batch, one layer, up to these sizes.
PROBE_MAX_ENTRIES = 2 ** 24  # score and state-feature entries of one probe, ~1 s forward and backward on 2 cores
PROBE_MAX_T = 1024           # tokens a document: the CPU's chunked form runs 4 chunks of 256, as a longer context does
LONG_EVALUATION_S = 600      # an evaluation estimated longer is said to be long, with a shorter context that is not
LONG_CPU_RUN_S = 24 * 3600   # a CPU training run estimated longer is said to be long


@dataclass
class Estimate:
    parameters: int
    model_bytes: float
    activation_bytes: float
    logits_bytes: float
    available_bytes: float | None
    seconds: float | None
    micro_docs: int
    checkpointing: bool
    steps: int = 0        # the steps the time counts: to the run's last step, less done_steps
    done_steps: int = 0   # a resumed run's checkpoint step (0: a run from its start)
    budget_step: int | None = None  # the step trainer.flops_budget stops the run at, where before trainer.max_steps

    @property
    def total_bytes(self) -> float:
        return self.model_bytes + self.activation_bytes + self.logits_bytes

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.total_bytes <= self.available_bytes


def data_vocab(cfg: DictConfig) -> int:
    """The data's vocabulary without reading (or generating) any token: an ICL task's `vocab + 1` (BOS); a prepared
    dataset's recorded vocab_size (its array metadata), GPT-2's when it cannot be read yet (its own check says why)."""
    if cfg.data.name == "icl_markov":
        return int(cfg.data.vocab) + 1
    if cfg.data.name == "mqar":  # keys, values, the filler and BOS
        return int(cfg.data.n_keys) + int(cfg.data.n_values) + 2
    try:
        from pathlib import Path

        from longctx.data import dataset_info

        return int(dataset_info(Path(str(cfg.data.path)).expanduser() / cfg.data.train_split)["vocab_size"])
    except Exception:  # missing or unreadable data: resolve_splits reports it, naming the key
        return GPT2_VOCAB


def saved_per_token_layer(model, cfg: DictConfig, device_type: str, checkpointing: bool) -> tuple[float, float]:
    """(elements kept per token per layer, elements of one block recomputed under checkpointing) (module docstring)."""
    from longctx.models.attention import attention_class
    from longctx.models.common import state_cores
    from longctx.models.registry import native_mixing

    PowerAttention = attention_class("power")

    spec, ctx, bf16 = model.spec, cfg.ctx, _bf16(cfg, device_type)
    # the MLP's hidden activations: pre- and post-GELU, or SwiGLU's gate, up, silu(gate) and their product
    mlp = 4 * spec.ffn_dim if spec.arch == "llama" else 2 * spec.mlp_ratio * spec.d_model
    around_core = spec.arch == "rwkv7" and native_mixing(spec.arch, spec.attention) is None
    block = spec.d_model * (RWKV7_AROUND_CORE if around_core else ARCH_SAVED.get(spec.arch, 16)) + mlp
    cores = list(state_cores(model))  # RWKV7: its time mixing, then the attention core inside it
    core = next((c for c in cores if isinstance(c, PowerAttention)), cores[0] if cores else None)
    if bf16:
        block += autocast_fp32(spec, gated=getattr(core, "gate", None) is not None)
    if isinstance(core, PowerAttention):
        dtype = torch.bfloat16 if bf16 else torch.float32
        chunk = core.kernel_chunk(ctx, device_type, dtype)
        if chunk is None and device_type != "cuda":
            block += core.n_heads * ctx * 5
        elif chunk is not None and chunk < ctx:
            block += core.state_size(ctx) / chunk
    elif spec.arch == "rwkv7" and spec.attention == "linear":  # its own time mixing: chunked delta rule
        block += spec.d_model * (46 if device_type != "cuda" else 1)
    elif spec.attention == "window" and device_type != "cuda" and ctx > cfg.attention.window:
        block += spec.n_heads * 2 * cfg.attention.window * 2
    if checkpointing:
        # each block's input, the residual stream: fp32 under autocast too (twice a bf16's bytes)
        return spec.d_model * (2 if bf16 else 1), block
    return block, 0.0


def backward_transient(model, cfg: DictConfig, device_type: str) -> float:
    """Elements per token (of the run's activation dtype) one layer's backward holds beyond what is kept: the
    attention form's one-kernel backward adds dq in fp32 (parallel.fused_backward), on CUDA."""
    from longctx.kernels.power import fused_backward
    from longctx.models.attention import attention_class
    from longctx.models.common import state_cores

    PowerAttention = attention_class("power")
    core = next((c for c in state_cores(model) if isinstance(c, PowerAttention)), None)
    if core is None or device_type != "cuda" or not fused_backward():
        return 0.0
    bf16 = _bf16(cfg, device_type)
    dtype = torch.bfloat16 if bf16 else torch.float32
    if core.kernel_chunk(cfg.ctx, device_type, dtype) is not None:
        return 0.0                 # the chunked form: its intra-chunk attention keeps the two-kernel backward
    return core.n_heads * core.head_dim * (2 if bf16 else 1)


def autocast_fp32(spec, gated: bool) -> float:
    """Elements per token per layer that bf16 autocast keeps in fp32, counted once more (`bytes` is 2): the residual
    stream stays fp32, so each norm's input (two a block) and RWKV7's token-shift mixes (both halves) are fp32, as are
    RWKV7's group-norm input and its squared-ReLU hidden (autocast runs pow in fp32), and a gated core's gate input
    (its fp32 projection)."""
    fp32 = 2 * spec.d_model
    if spec.arch == "rwkv7":
        fp32 += 3 * spec.d_model + spec.mlp_ratio * spec.d_model
    return fp32 + (spec.d_model if gated else 0)


def context_parallel(cfg: DictConfig) -> int:
    return int(cfg.trainer.get("context_parallel") or 1)


def context_parallel_saved(model, cfg: DictConfig, n: int, device_type: str, bytes_per: int) -> float:
    """Bytes per document the context-parallel exchange keeps for the backward, all layers, on the rank that keeps
    the most (the last): exp the gathered keys and values of all N slices (2 * d_model * ctx per layer); window the
    halo (2 * d_model * (window - 1)); power / linear the N gathered states (fp32, state_size floats each).
    Zero without CP."""
    if n == 1:
        return 0.0
    spec = model.spec
    if spec.attention == "exp":
        per_layer = 2 * spec.d_model * cfg.ctx * bytes_per
    elif spec.attention == "window":
        per_layer = 2 * spec.d_model * min(cfg.attention.window - 1, cfg.ctx) * bytes_per
    else:
        from longctx.models.common import state_cores
        per_layer = n * state_cores(model)[0].state_size(cfg.ctx) * 4
    return float(spec.n_layers * per_layer)


def _bf16(cfg: DictConfig, device_type: str) -> bool:
    return cfg.trainer.precision == "bf16" or (cfg.trainer.precision == "auto" and device_type == "cuda")


def available_memory(device: torch.device) -> float | None:
    if device.type == "cuda":
        return CUDA_MEMORY_SHARE * torch.cuda.get_device_properties(device).total_memory
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None  # unknown: no refusal


def fastest_seconds(work: Callable[[], object], repeats: int = 3) -> float:
    """Seconds of the fastest of `repeats` runs of `work` after one untimed run (first-use allocations, lazy inits):
    the fastest, since a shared machine's other work only slows some of them."""
    work()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def cpu_matmul_rate(n: int = 1024, reps: int = 3) -> float:
    """This machine's fp32 matmul FLOP/s: the fastest of a few 1024 x 1024 products (~0.1 s each)."""
    a = torch.randn(n, n)
    return 2 * n ** 3 / fastest_seconds(lambda: a @ a, reps)


def assumed_rate(device: torch.device, world_size: int = 1) -> float | None:
    """FLOP/s a run is assumed to reach (module docstring, Time): CUDA, CUDA_MFU of the card's bf16 peak per rank (None
    for a card of unknown peak); CPU, CPU_EFFICIENCY of this machine's fp32 matmul rate, measured now."""
    from longctx.train.flops import peak_bf16_flops

    if device.type == "cuda":
        peak = peak_bf16_flops(torch.cuda.get_device_name(device))
        return peak * CUDA_MFU * world_size if peak else None
    return cpu_matmul_rate() * CPU_EFFICIENCY


def rate_basis(device: torch.device) -> str:
    """What `assumed_rate` rests on, in words."""
    if device.type == "cuda":
        return f"{CUDA_MFU:.0%} of the card's bf16 peak"
    return f"{CPU_EFFICIENCY:.0%} of this CPU's fp32 matmul rate, measured now"


@functools.lru_cache(maxsize=None)
def reference_token_seconds(p: int, norm: bool, heads: int, head_dim: int, t: int, chunk: int | None, docs: int,
                            backward: bool, threads: int) -> float:
    """Seconds per token (one layer, `heads` heads) of the CPU power reference on `docs` documents of t tokens in
    chunks of `chunk` (None: the attention form), forward (and backward), matmuls included, on `threads` threads
    (torch.get_num_threads(): the cache's key); timed once a process (fastest_seconds, one run after a warm-up)."""
    from longctx.kernels import power_attention  # CPU tensors: the reference

    inputs = [torch.randn(docs, t, heads, head_dim, device="cpu", requires_grad=backward) for _ in range(3)]
    inputs.append((-0.1 * torch.rand(docs, t, heads, device="cpu")).requires_grad_(backward))  # log-gates

    def run():
        with torch.set_grad_enabled(backward):
            y = power_attention(*inputs, p=p, norm=norm, chunk_size=chunk)
            if backward:
                torch.autograd.grad(y.sum(), inputs)
    return fastest_seconds(run, repeats=1) / (docs * t)


def cpu_reference_seconds(model, ctx: int, docs: int, rate: float, backward: bool) -> float:
    """Seconds per token, all layers, that the CPU power reference (power and linear attention on a CPU) takes beyond
    its FLOPs at `rate`: it builds each block's whole scores (the masked half too) and makes a dozen elementwise
    passes over them (log-space power, gates, stabilizer; more in the backward), and the chunked form expands each
    query and key to the state's D features, none of which a FLOP count holds. Timed (`reference_token_seconds`) on
    up to `docs` documents (a forward's) of min(ctx, PROBE_MAX_T) tokens in the form that runs at ctx, with as many
    heads and documents as keep the probe's score and feature entries within PROBE_MAX_ENTRIES (its time and memory:
    a few hundred MB), scaled to all heads; the attention form's time per token grows with the context, so a longer
    one is scaled up to ctx."""
    from longctx.kernels import state_dim
    from longctx.models.attention import attention_class
    from longctx.models.common import state_cores
    from longctx.train.flops import TRAIN_FLOPS_FACTOR

    PowerAttention = attention_class("power")
    seconds = 0.0
    for core in state_cores(model):
        if isinstance(core, PowerAttention):
            block = core.block_length(ctx, "cpu", torch.float32)
            t = min(ctx, PROBE_MAX_T)
            chunk = block if block < t else None
            # entries per head and document: the scores of each block, and the chunked form's expanded features
            entries = t * (min(block, t) + (state_dim(core.p, core.head_dim) if chunk else 0))
            heads = max(1, min(core.n_heads, PROBE_MAX_ENTRIES // entries))
            probed = min(docs, max(1, PROBE_MAX_ENTRIES // (heads * entries)))
            measured = reference_token_seconds(core.p, core.norm, heads, core.head_dim, t, chunk, probed, backward,
                                               torch.get_num_threads()) * core.n_heads / heads
            counted = core.form_flops(t, chunk) * (TRAIN_FLOPS_FACTOR if backward else 1.0) / rate
            seconds += max(0.0, measured - counted) * block / min(block, t)
    return seconds


def estimate(cfg: DictConfig, device: torch.device, spec_for: Callable, world_size: int = 1,
             micro_docs: int | None = None, checkpointing: bool | None = None, available: float | None = None,
             rate: float | None = None, probe: bool = False, done_steps: int = 0) -> Estimate:
    """The run's memory (one rank) and time. `spec_for(data_vocab) -> ModelSpec`: the model the trainer builds for
    that vocabulary; `micro_docs`/`checkpointing` override the config's, to try options. probe: on a CPU, time the
    attention reference's work beyond its FLOPs (`cpu_reference_seconds`; else the time counts FLOPs only): only
    for an estimate that is said, after the memory decided the run fits. done_steps: the step a resumed run
    continues from; the time counts only the steps left to trainer.max_steps, or to the step trainer.flops_budget
    stops the run at when that comes first (`budget_step`)."""
    from longctx.models import build_model
    from longctx.train.flops import budget_steps, flops_report

    spec = spec_for(data_vocab(cfg))
    with torch.device("meta"):  # shapes only: nothing allocated, no init time
        model = build_model(spec)
    params = sum(p.numel() for p in model.parameters())
    n = context_parallel(cfg)
    local_docs = max(1, cfg.data.docs_per_batch // max(1, world_size // n))
    micro = min(micro_docs or cfg.trainer.micro_docs or local_docs, local_docs)
    if checkpointing is None:
        checkpointing = cfg.trainer.activation_checkpointing is True
    bytes_per = 2 if _bf16(cfg, device.type) else 4
    kept, recomputed = saved_per_token_layer(model, cfg, device.type, checkpointing)
    tokens = micro * cfg.ctx // n  # this rank's slice of its documents
    exchanged = context_parallel_saved(model, cfg, n, device.type, bytes_per)
    if checkpointing:  # only the block being recomputed holds its exchange
        exchanged /= spec.n_layers
    transient = backward_transient(model, cfg, device.type)
    activations = tokens * (spec.n_layers * kept + recomputed + transient) * bytes_per + micro * exchanged
    logits = 3 * min(tokens, LOSS_CHUNK) * spec.vocab_size * 4
    dtype = torch.bfloat16 if bytes_per == 2 else torch.float32
    train_flops = flops_report(model, cfg.ctx, device.type, dtype)["train_flops_per_token"]
    tokens_per_step = cfg.data.docs_per_batch * cfg.ctx
    budget_step = budget_steps(cfg.trainer.flops_budget, tokens_per_step, train_flops)  # the trainer's stop
    if budget_step is not None and budget_step >= cfg.trainer.max_steps:
        budget_step = None                                 # trainer.max_steps comes first
    seconds, steps = None, max(0, (budget_step or cfg.trainer.max_steps) - done_steps)
    if rate is None:
        rate = assumed_rate(device, world_size)
    if rate:
        per_token = train_flops / rate
        if probe and device.type != "cuda":
            per_token += cpu_reference_seconds(model, cfg.ctx, micro, rate, backward=True)
        seconds = steps * tokens_per_step * per_token
    if available is None:
        available = available_memory(device)
    return Estimate(params, 16.0 * params, activations, logits, available, seconds, micro, checkpointing, steps,
                    done_steps, budget_step)


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (no peak known for this card)"
    if seconds < 120:
        return f"~{seconds:.0f} s"
    return f"~{seconds / 60:.0f} min" if seconds < 7200 else f"~{seconds / 3600:.1f} h"


def _steps_left(est: Estimate) -> str:
    """The steps the time counts, where not simply trainer.max_steps: a resumed run's steps left, with the step it
    continues from; a run that trainer.flops_budget stops first, the steps the budget allows."""
    budget = " the FLOP budget allows (trainer.flops_budget)" if est.budget_step is not None else ""
    if est.done_steps:
        of = f" of the {est.budget_step:,}{budget}" if budget else ""
        return f" for the {est.steps:,} steps left after step {est.done_steps:,}{of}"
    return f" for the {est.steps:,} steps{budget}" if budget else ""


def describe(est: Estimate, device_name: str) -> str:
    avail = f" of {_gib(est.available_bytes)} available" if est.available_bytes is not None else ""
    # a relaunched finished run: no time to tell (the trainer says it is complete next)
    time = (f"none, no step is left after step {est.done_steps:,}" if est.done_steps and not est.steps else
            f"{_duration(est.seconds)}{_steps_left(est)} at an assumed rate, measured after the first steps")
    line = (f"estimate: peak memory ~{_gib(est.total_bytes)}{avail} on {device_name} ({est.parameters / 1e6:.2f}M "
            f"parameters with AdamW {_gib(est.model_bytes)}, activations {_gib(est.activation_bytes)} per micro-batch "
            f"of {est.micro_docs} docs{', checkpointed' if est.checkpointing else ''}, a loss chunk's logits "
            f"{_gib(est.logits_bytes)}); training time {time} "
            f"(formulas: longctx.train.estimate)")
    if device_name == "cpu" and est.seconds is not None and est.seconds > LONG_CPU_RUN_S:
        fewer = "a smaller trainer.flops_budget" if est.budget_step is not None else "fewer trainer.max_steps"
        line += (f"; that is long for a CPU: a GPU (README: On GPUs), a shorter ctx or {fewer} "
                 "(a step can take minutes before the first measured rate)")
    return line


def check_fits(cfg: DictConfig, device: torch.device, spec_for: Callable, world_size: int = 1,
               device_name: str | None = None, say: bool = True, **kwargs) -> Estimate:
    """Say the estimate (say=False: only refuse, as a staged run's up-front check of a later stage, which says its
    own when it starts; done_steps=K: a run resumed at step K, whose time counts the steps left); raise ValueError
    (one line, naming what to set) when the run cannot fit the memory. trainer.activation_checkpointing=auto on CUDA
    turns checkpointing on by itself when needed."""
    device_name = device_name or (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    if kwargs.get("rate") is None:
        kwargs["rate"] = assumed_rate(device, world_size)     # measured once (a CPU's), for every estimate below
    est = estimate(cfg, device, spec_for, world_size, **kwargs)
    kwargs["available"] = est.available_bytes     # measured once too
    tell = log.info if say else log.debug
    if est.fits:
        if say and device.type != "cuda" and est.steps:   # the time said counts the CPU reference's work too
            est = estimate(cfg, device, spec_for, world_size, probe=True, **kwargs)
        tell(describe(est, device_name))
        return est
    auto = cfg.trainer.activation_checkpointing == "auto" and device.type == "cuda"
    with_ckpt = estimate(cfg, device, spec_for, world_size, checkpointing=True, **kwargs)
    if auto and with_ckpt.fits:
        tell(describe(with_ckpt, device_name) + "; trainer.activation_checkpointing=auto will turn it on")
        return with_ckpt
    need = (f"memory: this run needs ~{_gib(est.total_bytes)} on {device_name} but {_gib(est.available_bytes)} "
            f"is available (ctx={cfg.ctx}, {est.micro_docs} docs per micro-batch, {est.parameters / 1e6:.2f}M "
            f"parameters)")
    advice = fitting_advice(cfg, device, spec_for, world_size, est, with_ckpt, kwargs)
    if advice:
        raise ValueError(f"{need}; {advice}")
    least = estimate(cfg, device, spec_for, world_size, micro_docs=1, checkpointing=True, **kwargs)
    raise ValueError(f"{need}; even trainer.micro_docs=1 with trainer.activation_checkpointing=true needs "
                     f"~{_gib(least.total_bytes)}: a smaller ctx or model")


def fitting_advice(cfg: DictConfig, device: torch.device, spec_for: Callable, world_size: int, est: Estimate,
                   with_ckpt: Estimate, kwargs: dict) -> str:
    """What to set for a run that does not fit (`est`; `with_ckpt`: the same micro-batch checkpointed), "" when
    nothing does. First the largest micro-batch (a divisor of the rank's documents) that fits without activation
    checkpointing, which recomputes each block's forward in the backward (~1/3 more compute a step); then, where it
    lets a larger micro-batch fit than that (more tokens a forward, for a GPU that a small one leaves idle), the
    largest that fits with checkpointing, as the other choice; checkpointing alone where nothing fits without it."""
    local_docs = max(1, cfg.data.docs_per_batch // max(1, world_size // context_parallel(cfg)))
    micros = [m for m in range(est.micro_docs - 1, 0, -1) if local_docs % m == 0]

    def largest(ckpt: bool, tried: list[int]) -> Estimate | None:
        for micro in tried:
            smaller = estimate(cfg, device, spec_for, world_size, micro_docs=micro, checkpointing=ckpt, **kwargs)
            if smaller.fits:
                return smaller
        return None

    plain = None if est.checkpointing else largest(False, micros)
    recomputed = with_ckpt if with_ckpt.fits else largest(True, micros)
    if recomputed is not None and plain is not None and recomputed.micro_docs <= plain.micro_docs:
        recomputed = None    # no larger micro-batch for the recomputation: not worth naming
    options = []
    if plain is not None:
        options.append(f"trainer.micro_docs={plain.micro_docs} (~{_gib(plain.total_bytes)})")
    if recomputed is not None:
        parts = [f"trainer.micro_docs={recomputed.micro_docs}"] if recomputed.micro_docs != est.micro_docs else []
        if not est.checkpointing:
            parts.append("trainer.activation_checkpointing=true")
        costs = "; it recomputes each block's forward, ~1/3 more compute a step" if plain is not None else ""
        options.append(f"{' and '.join(parts)} (~{_gib(recomputed.total_bytes)}{costs})")
    return f"set {', or '.join(options)}" if options else ""


# ----- evaluation: forwards without gradients ------------------------------------------------------------------
def forward_memory(model, cfg: DictConfig, ctx: int, micro_docs: int, device_type: str, bf16: bool) -> dict:
    """Peak bytes of an evaluation forward (no gradients) of `micro_docs` documents of `ctx` tokens, by part:
    `weights` (fp32, plus the bf16 copies autocast makes), `activations` (one block's at a time, since nothing is
    kept for a backward: the training count of one block, attention form included), `loss` (one chunk of the fused
    loss, and the float64 per-token losses). An upper bound: on CPU, 1.3-1.8x the peak resident memory measured for
    GPT-2 forwards at ctx 8k-64k (exp and power)."""
    from omegaconf import OmegaConf

    at = OmegaConf.merge(cfg, {"ctx": ctx, "trainer": {"precision": "bf16" if bf16 else "fp32"}})
    _, block = saved_per_token_layer(model, at, device_type, checkpointing=True)
    params = sum(p.numel() for p in model.parameters())
    tokens = micro_docs * ctx
    return {"weights": params * (6 if bf16 else 4), "activations": tokens * block * (2 if bf16 else 4),
            "loss": 3 * min(tokens, LOSS_CHUNK) * model.spec.vocab_size * 4 + tokens * 8}


def check_evaluation_fits(flag: str, ctx: int, forward: dict, device: torch.device, held: float, held_what: str,
                          advice: str) -> None:
    """Raise ValueError, one line naming `flag`, the context, the estimate and the memory available, when an
    evaluation at `ctx` cannot fit: its forward (`forward_memory`) on `device`, and the `held` bytes of token arrays
    it keeps on the host (the same memory on a CPU). `advice` ends the line."""
    cpu = available_memory(torch.device("cpu"))
    parts = ", ".join(f"{k} {_gib(v)}" for k, v in forward.items())
    if device.type == "cpu":
        needs = [("cpu", sum(forward.values()) + held, cpu, f"forward: {parts}; {held_what} {_gib(held)}")]
    else:
        needs = [(str(device), sum(forward.values()), available_memory(device), f"forward: {parts}"),
                 ("the host", held, cpu, f"{held_what} {_gib(held)}")]
    for where, need, available, detail in needs:
        if available is not None and need > available:
            raise ValueError(f"{flag}: {ctx} needs ~{_gib(need)} of memory on {where} but {_gib(available)} is "
                             f"available ({detail}; formulas: longctx.train.estimate); {advice}")


def evaluation_seconds(model, contexts: list[int], docs: int, per_forward: int, device: torch.device, bf16: bool,
                       rate: float) -> tuple[float, float]:
    """(forward FLOPs, seconds) of the forwards (no gradients) of `docs` documents at each of `contexts`,
    `per_forward` at a time: the FLOPs of the form that runs at each context (longctx.train.flops) over `rate`
    FLOP/s, plus on a CPU the attention reference's time beyond them (`cpu_reference_seconds`)."""
    from longctx.train.flops import flops_report

    dtype = torch.bfloat16 if bf16 else torch.float32
    flops = seconds = 0.0
    for ctx in contexts:
        report = flops_report(model, ctx, device.type, dtype)
        per_token = report["weight_flops_per_token"] + report["executed_state_flops_per_token"]
        flops += docs * ctx * per_token
        seconds += docs * ctx * per_token / rate
        if device.type != "cuda":
            seconds += docs * ctx * cpu_reference_seconds(model, ctx, per_forward, rate, backward=False)
    return flops, seconds


def evaluation_line(model, contexts: list[int], docs: int, per_forward: int, device: torch.device, bf16: bool,
                    flag: str, shorter: list[list[int]], otherwise: str, unit: str = "doc") -> str:
    """One line, said before an evaluation's first forward: how long the forwards of `docs` documents (`unit`s) at
    each of `contexts` take at `assumed_rate`, and what that rests on. Over LONG_EVALUATION_S it says so, naming the
    first of `shorter` (lists of contexts to give `flag`, longest first) that is not, and `otherwise` (fewer
    documents: the context kept)."""
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    each = "ctx" if len(contexts) == 1 else "each ctx of"
    what = f"{docs} {unit}{'s' * (docs != 1)} at {each} {','.join(map(str, contexts))}"
    rate = assumed_rate(device)
    if rate is None:
        return f"estimate: the time of the forwards of {what} is unknown on {where} (no bf16 peak known for this card)"
    flops, seconds = evaluation_seconds(model, contexts, docs, per_forward, device, bf16, rate)
    reference = ", plus the attention reference's measured time" if seconds > 1.01 * flops / rate else ""
    line = (f"estimate: the forwards of {what} take {_duration(seconds)} on {where} ({flops:.2g} forward FLOPs at "
            f"~{rate / 1e9:.3g} GFLOP/s, {rate_basis(device)}{reference}; formulas: longctx.train.estimate)")
    if seconds <= LONG_EVALUATION_S:
        return line
    for option in shorter:
        took = evaluation_seconds(model, option, docs, per_forward, device, bf16, rate)[1]
        if took <= LONG_EVALUATION_S:
            return (f"{line}; that is long: {flag} {','.join(map(str, option))} would take {_duration(took)}, "
                    f"or {otherwise}")
    return f"{line}; that is long: {otherwise}"


# ----- command line: the longest context that fits N GPUs ---------------------------------------------------------
def longest_context(cfg: DictConfig, gpus: int, memory_gib: float, max_log2: int = 24) -> list[tuple]:
    """(ctx, Estimate without checkpointing, Estimate with it) for ctx = 2^k, 1024 <= ctx <= 2^max_log2 (a multiple of
    `gpus`, a power of two)
    on `gpus` CUDA ranks of one CP group (trainer.context_parallel=gpus) of `memory_gib` GiB each (90% usable)."""
    from omegaconf import OmegaConf

    from longctx.models.spec import model_spec, model_vocab_size

    rows = []
    for k in range(max(10, (gpus - 1).bit_length()), max_log2 + 1):
        at = OmegaConf.merge(cfg, {"ctx": 2 ** k, "trainer": {"context_parallel": gpus}})

        def spec_for(vocab, at=at):
            return model_spec(at, model_vocab_size(vocab))

        kw = dict(world_size=gpus, available=CUDA_MEMORY_SHARE * memory_gib * GIB, rate=0.0)
        rows.append((2 ** k, estimate(at, torch.device("cuda"), spec_for, checkpointing=False, **kw),
                     estimate(at, torch.device("cuda"), spec_for, checkpointing=True, **kw)))
    return rows


def main(argv=None) -> int:
    """The memory of one GPU (a CUDA bf16 run, whatever machine this runs on) at each power-of-two context from 1024,
    and the longest that fits, with and without activation checkpointing; a `ctx=` override is replaced by that
    range (train.py's own estimate, at launch, covers a CPU run at its ctx)."""
    import argparse
    import sys

    from hydra import compose, initialize_config_dir

    from longctx.train.config import CONF_DIR, validate
    from longctx.train.launch import check_overrides

    parser = argparse.ArgumentParser(prog="python -m longctx.train.estimate",
                                     description=" ".join(main.__doc__.split()))
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of one context-parallel group (its N); default 1")
    parser.add_argument("--memory-gib", type=float, default=141.0,
                        help="memory of one GPU, GiB; default 141 (an H200; an H100: 80)")
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. attention=power p=2 model=small")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.gpus < 1 or args.gpus & (args.gpus - 1) or args.memory_gib <= 0:
            raise ValueError(f"--gpus={args.gpus} --memory-gib={args.memory_gib}: a power of two and a positive size")
        check_overrides(list(args.overrides), CONF_DIR)  # a mistyped key or option: named, before Hydra composes
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(args.overrides))
        validate(cfg)
        from omegaconf import OmegaConf
        validate(OmegaConf.merge(cfg, {"trainer": {"context_parallel": args.gpus}, "ctx": 2 ** 24}))
        rows = longest_context(cfg, args.gpus, args.memory_gib)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    micro = rows[0][1].micro_docs
    print(f"{' '.join(args.overrides) or 'the default config'}: a CUDA bf16 run, one rank of "
          f"trainer.context_parallel={args.gpus}, "
          f"{micro} document(s) a micro-batch, {args.memory_gib:g} GiB a GPU ({CUDA_MEMORY_SHARE:.0%} usable)")
    print(f"{'ctx':>10} {'peak GiB':>10} {'checkpointed':>13}")
    for ctx, plain, ckpt in rows:
        print(f"{ctx:>10} {plain.total_bytes / GIB:>10.3g} {ckpt.total_bytes / GIB:>13.3g}")
    for name, col in (("without activation checkpointing", 1), ("with trainer.activation_checkpointing=true", 2)):
        fits = [row[0] for row in rows if row[col].fits]
        at_least = "at least " if fits and fits[-1] == rows[-1][0] else ""
        print(f"longest ctx that fits {name}: {at_least}{fits[-1] if fits else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
