"""The memory estimate before training: its activation formula against the tensors autograd really keeps, and the
refusal that names what to set, said before any data is generated."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longctx.models import build_model
from longctx.train.estimate import GIB, check_fits, estimate, fastest_seconds
from longctx.train.trainer import model_spec, model_vocab_size

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
KNOWN = {"rate": 1e9}  # no matmul timing in these tests


def spec_for(cfg):
    return lambda vocab: model_spec(cfg, model_vocab_size(vocab))


def saved_bytes(cfg, docs: int) -> int:
    """Bytes of the tensors one forward keeps for its backward (parameters excluded), each storage counted once."""
    torch.manual_seed(0)
    model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, model.spec.vocab_size, (docs, cfg.ctx))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x, reduction="sum")
    return sum(n for ptr, n in kept.items() if ptr not in params)


@pytest.mark.parametrize("overrides", [
    ["ctx=256"],
    ["ctx=256", "attention=power"],                       # the CPU reference's attention form: quadratic
    ["ctx=512", "model.d_model=128", "model.n_heads=2"],
    ["ctx=512", "attention=window", "window=64"],
    ["ctx=256", "arch=rwkv7", "model.d_model=256", "model.n_heads=4"],
    ["ctx=256", "arch=rwkv7", "attention=linear", "model.d_model=256", "model.n_heads=4"],
    ["ctx=256", "arch=llama", "model.d_model=128", "model.n_heads=4", "arch.n_kv_heads=1", "arch.d_ff=768"],
], ids=lambda o: " ".join(o))
def test_activation_formula_matches_what_autograd_keeps(compose, overrides):
    cfg = compose("run_dir=unused", "data.docs_per_batch=2", "trainer.num_threads=2", *overrides)
    est = estimate(cfg, CPU, spec_for(cfg), available=1e15, **KNOWN)
    measured = saved_bytes(cfg, 2)
    assert 0.7 < measured / est.activation_bytes < 1.3, (measured, est.activation_bytes)
    assert est.model_bytes == 16 * sum(p.numel() for p in build_model(model_spec(
        cfg, model_vocab_size(cfg.data.vocab + 1))).parameters())


def test_refusal_names_what_to_set(compose):
    cfg = compose("run_dir=unused", "ctx=4096", "data.docs_per_batch=32")
    full = estimate(cfg, CPU, spec_for(cfg), available=1e15, **KNOWN)
    ckpt = estimate(cfg, CPU, spec_for(cfg), checkpointing=True, available=1e15, **KNOWN)
    assert ckpt.total_bytes < full.total_bytes
    assert check_fits(cfg, CPU, spec_for(cfg), available=full.total_bytes * 1.01, **KNOWN).fits
    with pytest.raises(ValueError, match=r"^memory: .*set trainer.activation_checkpointing=true \("):
        check_fits(cfg, CPU, spec_for(cfg), available=(full.total_bytes + ckpt.total_bytes) / 2, **KNOWN)
    eighth = estimate(cfg, CPU, spec_for(cfg), micro_docs=4, checkpointing=True, available=1e15, **KNOWN)
    with pytest.raises(ValueError, match=r"set trainer.micro_docs=4 and trainer.activation_checkpointing=true"):
        check_fits(cfg, CPU, spec_for(cfg), available=eighth.total_bytes * 1.01, **KNOWN)
    with pytest.raises(ValueError, match=r"even trainer.micro_docs=1 .*: a smaller ctx or model$"):
        check_fits(cfg, CPU, spec_for(cfg), available=full.model_bytes, **KNOWN)


def test_time_estimate_is_steps_times_tokens_times_flops_over_the_rate(compose):
    from longctx.train.flops import flops_report

    cfg = compose("run_dir=unused", "trainer.max_steps=10")
    with torch.device("meta"):
        model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    per_token = flops_report(model, cfg.ctx, "cpu", torch.float32)["train_flops_per_token"]
    est = estimate(cfg, CPU, spec_for(cfg), rate=2e9, available=1e15)
    assert est.seconds == pytest.approx(10 * cfg.data.docs_per_batch * cfg.ctx * per_token / 2e9)


def test_a_run_that_cannot_fit_is_refused_before_any_data_is_generated(train_env, compose, tmp_path):
    cfg = compose("run_dir=unused", "ctx=100000", "device=cpu")
    est = estimate(cfg, CPU, spec_for(cfg))
    if est.fits:  # a host with that much memory: the estimate says it fits (nothing to refuse)
        pytest.skip(f"ctx=100000 fits this host: ~{est.total_bytes / GIB:.1f} GiB of "
                    f"{est.available_bytes / GIB:.1f} GiB")
    env = {**train_env, "LONGCTX_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, str(REPO / "train.py"), "ctx=100000", "device=cpu",
                          f"hydra.run.dir={tmp_path / 'run'}"], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: memory: this run needs ~"), out.stderr
    assert "trainer.activation_checkpointing=true" in lines[0] or "trainer.micro_docs=" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()  # nothing written, nothing generated


@pytest.mark.gpu
@pytest.mark.parametrize("overrides", [["attention=exp"], ["attention=power", "p=2"], ["attention=window"],
                                       ["arch=rwkv7", "attention=power", "p=2"]], ids=lambda o: " ".join(o))
def test_cuda_estimate_against_a_measured_step(compose, overrides):
    """One training step of GPT-2/RWKV7 small at ctx 16384 (bf16 autocast, AdamW): the measured peak of the CUDA
    allocator against the estimate's total."""
    cfg = compose("run_dir=unused", "model=small", "ctx=16384", "data.doc_len=16384", "data.docs_per_batch=2",
                  "trainer.activation_checkpointing=false", *overrides)
    device = torch.device("cuda")
    est = estimate(cfg, device, spec_for(cfg), available=1e15, rate=1e12)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    model = build_model(spec_for(cfg)(cfg.data.vocab + 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, model.spec.vocab_size, (2, cfg.ctx), device=device)
    for _ in range(2):  # the second step has AdamW's moments allocated
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, x, reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated(device) - start
    del model, optimizer, loss
    torch.cuda.empty_cache()
    assert 0.6 < peak / est.total_bytes < 1.5, (peak / GIB, est.total_bytes / GIB)


# The estimate aims at 2x of what runs; 2.5x leaves room for a machine shared with other tests. The two tests that time
# real work are `slow`: that suite runs on one process, not beside another test worker. Counting FLOPs alone (no
# probe of the power reference) estimates the power steps here 2-3x short and the forwards at 512 6x: these fail.
CPU_TIME_TOLERANCE = 2.5


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["attention=exp"], ["attention=power"],
                                       ["attention=power", "ctx=512", "data.docs_per_batch=8"],
                                       ["attention=power", "ctx=2048", "data.docs_per_batch=2"]],  # chunked form
                         ids=lambda o: " ".join(o))
def test_cpu_step_time_estimate_against_measured_steps(compose, overrides):
    """One training step (forward, backward, AdamW) of the default model on a CPU, timed, against the estimate of one
    step: FLOPs over half the measured matmul rate, plus the power reference's measured elementwise time."""
    cfg = compose("run_dir=unused", "trainer.max_steps=1", *overrides)
    est = estimate(cfg, CPU, spec_for(cfg), available=1e15, probe=True)
    torch.manual_seed(0)
    model = build_model(spec_for(cfg)(cfg.data.vocab + 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, model.spec.vocab_size, (cfg.data.docs_per_batch, cfg.ctx))

    def step():
        model(x, x, reduction="sum").backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    measured = fastest_seconds(step)
    assert 1 / CPU_TIME_TOLERANCE < est.seconds / measured < CPU_TIME_TOLERANCE, (est.seconds, measured)


@pytest.mark.slow
@pytest.mark.parametrize("attention, ctx, docs", [("exp", 1024, 8), ("power", 512, 16), ("power", 4096, 2)])
def test_cpu_evaluation_time_estimate_against_measured_forwards(attention, ctx, docs):
    """Forwards without gradients on a CPU (what `python -m longctx.evaluate` runs), timed, against the evaluation's
    estimate: the attention form of power attention at 512, its chunked form at 4096."""
    from longctx.models import ModelSpec
    from longctx.train.estimate import assumed_rate, evaluation_seconds

    torch.manual_seed(0)
    model = build_model(ModelSpec(attention=attention, attention_params={"p": 2} if attention == "power" else {},
                                  d_model=64, n_heads=2, n_layers=3, vocab_size=5, ctx=ctx)).eval()
    x = torch.randint(0, 5, (docs, ctx))

    def forwards():
        with torch.no_grad():
            model(x)

    measured = fastest_seconds(forwards, repeats=2)
    estimated = evaluation_seconds(model, [ctx], docs, docs, CPU, False, assumed_rate(CPU))[1]
    assert 1 / CPU_TIME_TOLERANCE < estimated / measured < CPU_TIME_TOLERANCE, (estimated, measured)


@pytest.mark.parametrize("overrides, fp32_dq", [
    (["attention=power", "p=3", "ctx=65536"], True),     # p >= 3: the attention form at every length
    (["attention=power", "ctx=1024"], True),             # p=2 below the chunked form's threshold
    (["attention=power", "ctx=65536"], False),           # p=2 at 64k: the chunked form (two-kernel intra-chunk)
    (["attention=exp", "ctx=1024"], False),
], ids=lambda o: " ".join(o) if isinstance(o, list) else str(o))
def test_backward_transient_counts_the_one_kernel_backwards_fp32_dq(compose, overrides, fp32_dq, monkeypatch):
    """On CUDA the attention form's one-kernel backward holds dq in fp32 (4 bytes a query feature) during one layer's
    backward: counted once, whatever checkpointing keeps; none where it does not run (chunked form, deterministic
    mode, a CPU)."""
    from longctx.train.estimate import backward_transient

    cfg = compose("run_dir=unused", *overrides)
    with torch.device("meta"):
        model = build_model(model_spec(cfg, model_vocab_size(cfg.data.vocab + 1)))
    bytes_per = 4 if cfg.trainer.precision == "fp32" else 2      # auto: bf16 autocast on CUDA
    want = cfg.model.d_model * 4 / bytes_per if fp32_dq else 0.0
    assert backward_transient(model, cfg, "cuda") == want
    assert backward_transient(model, cfg, "cpu") == 0.0
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert backward_transient(model, cfg, "cuda") == 0.0


def test_a_cpu_run_estimated_past_a_day_is_said_to_be_long(compose):
    """`ctx=100000 trainer.activation_checkpointing=true` on a CPU was estimated at ~1,082 h and simply started: past
    LONG_CPU_RUN_S the estimate line says so and what to change; on a GPU, or shorter, it does not."""
    from dataclasses import replace

    from longctx.train.estimate import LONG_CPU_RUN_S, describe

    est = estimate(compose("run_dir=unused"), CPU, spec_for(compose("run_dir=unused")), available=1e15, **KNOWN)
    long_run = replace(est, seconds=2 * LONG_CPU_RUN_S)
    assert describe(long_run, "cpu").endswith("that is long for a CPU: a GPU (README: On GPUs), a shorter ctx or "
                                              "fewer trainer.max_steps (a step can take minutes before the first "
                                              "measured rate)")
    assert "that is long" not in describe(long_run, "NVIDIA H200")
    assert "that is long" not in describe(replace(est, seconds=LONG_CPU_RUN_S / 2), "cpu")


def test_a_resumed_run_estimates_only_the_steps_left(compose):
    """trainer.resume=true at step 4 of trainer.max_steps=10: the time counts the 6 steps left, and the line says
    so; a run from its start (or one past its last step) says no steps left."""
    from longctx.train.estimate import describe

    cfg = compose("run_dir=unused", "trainer.max_steps=10")
    full = estimate(cfg, CPU, spec_for(cfg), available=1e15, **KNOWN)
    resumed = estimate(cfg, CPU, spec_for(cfg), available=1e15, done_steps=4, **KNOWN)
    assert (full.steps, resumed.steps, resumed.done_steps) == (10, 6, 4)
    assert resumed.seconds == pytest.approx(full.seconds * 6 / 10)
    assert "for the 6 steps left after step 4 at an assumed rate" in describe(resumed, "cpu")
    assert "steps left" not in describe(full, "cpu")
    assert estimate(cfg, CPU, spec_for(cfg), available=1e15, done_steps=12, **KNOWN).seconds == 0
    said = check_fits(cfg, CPU, spec_for(cfg), available=1e15, done_steps=4, **KNOWN)
    assert (said.steps, said.done_steps) == (6, 4)


def test_the_readmes_one_gpu_commands_fit_an_80_gb_card(compose):
    """The README's one-GPU train.py lines at 64k (quick start, experiment=paper) pass the launch's memory check on
    an 80 GB card (a CUDA bf16 run: 90% of 80e9 bytes usable) instead of being refused."""
    readme = (REPO / "README.md").read_text().splitlines()
    commands = [line.split("#")[0].split()[2:] for line in readme
                if re.match(r"python train\.py (?!-m ).*(ctx=65536|experiment=paper)", line)]
    assert len(commands) >= 2, commands
    for overrides in commands:
        cfg = compose("run_dir=unused", *overrides)
        est = check_fits(cfg, torch.device("cuda"), spec_for(cfg), device_name="an 80 GB GPU", available=0.9 * 80e9,
                         rate=1e15)
        assert est.fits, overrides
