"""Run by test_decoding_kernel.py in a subprocess with TRITON_INTERPRET=1 (the interpreter is chosen when triton is
imported, so it must not leak into the test process): the fused decoding-step kernel against the float64 plain-torch
step at tiny sizes, p = 1..4, gated and ungated, normalized and not, d = 16 and 32, GQA, one program per head and
states split over several programs, three tokens in a row (the ticket is reset for the next launch), q/k/v and the
gate as strided views, the gate given as its log or computed in the kernel from its input (`full`: every p x d x
gate x norm x 1 or 2 query heads a key head; default: a quick set).
Prints one line per case; exits non-zero on a failure. Error measure: relative Frobenius error of y, s and z after
each token, against a few times the fp32 plain-torch step's own (the worse of its grouped and per-query-head
products)."""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
import torch  # noqa: E402
import triton  # noqa: E402

from longctx.kernels.power.decode import gate_log, power_state_step, symmetric_power_indices  # noqa: E402
from longctx.kernels.power.decode_kernel import power_decode_step_kernel  # noqa: E402

# (p, d, gated, norm, b, hq, hk, split, block_d, dtype of q/k/v); split None: the launcher's own choice; block_d 0:
# about a seventh of the state's rows (a few blocks a program: the interpreter runs each block in numpy)
QUICK = [(p, d, gated, norm, 2, 4, 2, 3, 0, torch.float32)
         for p, d, gated, norm in [(1, 16, True, False), (2, 16, True, True), (2, 32, False, True),
                                   (3, 16, False, False), (4, 16, True, True)]]
QUICK += [(2, 16, True, True, 1, 2, 2, 1, None, torch.float32),     # one program per head, the default block
          (2, 32, True, True, 2, 2, 2, 3, 0, torch.float32),        # one query head a key head, split
          (2, 16, "x", True, 2, 4, 2, 3, 0, torch.float32),         # the gate from its input, in the kernel
          (3, 16, True, False, 1, 2, 2, 20, 32, torch.float32),     # 20 shares a head, read in one load of 64
          (1, 32, "x", False, 1, 2, 2, 1, None, torch.float32),
          (2, 32, True, True, 2, 6, 2, None, 32, torch.float32),    # 3 query heads a key head (REP not a power of 2)
          (2, 16, True, True, 2, 2, 1, 4, 16, torch.float16),       # half inputs: y in fp16
          # the tuning knobs: 20 shares read in two loads of 16, the state loaded first; 3 shares in loads of 2 and
          # the in-kernel gate after the first block's loads; one program a head with the gate after its first block
          (3, 16, True, False, 1, 2, 2, 20, 32, torch.float32, dict(reduce_chunk=16, state_first=True)),
          (2, 32, "x", True, 2, 4, 2, 3, 0, torch.float32, dict(reduce_chunk=2, state_first=True)),
          (2, 16, "x", True, 2, 4, 2, 1, 16, torch.float32, dict(state_first=True))]
FULL = [(p, d, gated, norm, 2, 2 * rep, 2, 3, 0, torch.float32)
        for p in (1, 2, 3, 4) for d in (16, 32) for gated in (True, "x", False) for norm in (True, False)
        for rep in (1, 2)]
TOKENS = 3        # after WARM tokens: the ticket must be reset by each launch
WARM = 4          # the state starts as the reference leaves it after 4 tokens (z > 0: a real normalizer)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def run(p, d, gated, norm, b, hq, hk, split, block_d, dtype, knobs, g):
    index, weight = symmetric_power_indices(p, d)
    D = index.shape[1]
    block_d = max(16, triton.next_power_of_2(D // 7)) if block_d == 0 else block_d
    s64 = torch.zeros(b, hk, D, d, dtype=torch.float64)
    z64 = torch.zeros(b, hk, D, dtype=torch.float64)
    for _ in range(WARM):
        k, v = (torch.randn(b, 1, hk, d, generator=g, dtype=torch.float64) for _ in range(2))
        power_state_step(s64, z64, index, weight.double(), k.repeat_interleave(hq // hk, 2), k, v,
                         -torch.rand(b, 1, hk, generator=g, dtype=torch.float64), p, norm, d ** -0.5)
    s, z = s64.float(), z64.float()
    # the plain-torch step in fp32, the rounding floor of this precision: its grouped product (all rep query heads of
    # a key head in one matmul) and, where rep > 1, one query head at a time (a vector-matrix product, as the kernel
    # sums) -- how closely a CPU's matmul rounds the grouped one varies by machine
    rep = hq // hk
    states32 = [(s.clone(), z.clone()) for _ in range(1 + (rep > 1) * rep)]
    ticket = torch.zeros(b * hk, dtype=torch.int32)
    worst = floor = 0.0
    for _ in range(TOKENS):
        qkv = torch.randn(b, 1, hq + 2 * hk, d, generator=g).to(dtype)     # q, k, v: strided views of one tensor
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
        log_g = gate = None
        if gated == "x":    # the gate computed in the kernel from its input (d_model 300: two blocks of 256)
            gate = (torch.randn(b, 1, 300, generator=g), torch.randn(hk, 300, generator=g) * 0.1,
                    torch.randn(hk, generator=g) + 3.0)
            log_g = gate_log(*gate)
        elif gated:
            log_g = -torch.rand(b, 1, 2 * hk, generator=g)[..., ::2]                  # a strided view too
        y_ref = power_state_step(s64, z64, index, weight.double(), q.double(), k.double(), v.double(),
                                 None if log_g is None else log_g.double(), p, norm, d ** -0.5)
        y32 = [power_state_step(s32, z32, index, weight, qh.float(), k.float(), v.float(), log_g, p, norm, d ** -0.5)
               for qh, (s32, z32) in zip([q] + [q[:, :, r::rep] for r in range(rep)], states32)]
        if rep > 1:   # the per-head outputs back in head order (query head j * rep + r reads key head j)
            y32[1:] = [torch.stack(y32[1:], dim=3).reshape(y_ref.shape)]
            assert rel(y32[1], y32[0]) < 1e-3, "the per-head fp32 step must compute the grouped one's output"
        y = power_decode_step_kernel(s, z, index.int(), weight, ticket, q, k, v, None if gate else log_g, p, norm,
                                     d ** -0.5, split=split, block_d=block_d, gate=gate, **knobs)
        assert y.dtype == dtype and y.shape == (b, 1, hq, d) and torch.isfinite(y).all()
        assert ticket.eq(0).all(), ticket                                   # reset for the next launch
        worst = max(worst, rel(y, y_ref), rel(s, s64), rel(z, z64))
        floor = max(floor, *(rel(y_fp32, y_ref) for y_fp32 in y32))
    return worst, floor


def run_models():
    """The static decoder with power's state step on the kernel (interpreted; on CPU the dispatch would take the
    plain-torch step): p = 1..3, gated or not, on both architectures, every step's logits equal a full forward
    (fp32, 1e-4), as tests/models/test_decoding.py checks the plain-torch step. Returns the number of failures."""
    from longctx.kernels.power import decode as power_decode
    from longctx.models import build_model
    from longctx.models.attention import power as power_core
    from longctx.models.decoding import StaticDecoder
    from _checks import VOCAB, perturb_, tiny_spec

    def on_kernel(s, z, index, weight, ticket, q, k, v, log_g, p, norm, scale, fused=True, gate=None):
        assert fused and power_decode.fused_kernel_takes(s, z, q)
        block_d = max(16, triton.next_power_of_2(s.shape[2] // 4))                     # 4 blocks, 2 programs a head
        return power_decode_step_kernel(s, z, index, weight, ticket, q, k, v, log_g, p, norm, scale, split=2,
                                        block_d=block_d, gate=gate)
    power_core.power_decode_step = on_kernel
    failed = 0
    for arch, case in [("gpt2", dict(p=1)), ("gpt2", dict(p=2)), ("gpt2", dict(p=2, gating=False)),
                       ("gpt2", dict(p=3, chunk_size=None)), ("rwkv7", dict(p=2))]:
        torch.manual_seed(0)
        model = perturb_(build_model(tiny_spec(arch, attention="power", **case)), 0.05).eval()
        x = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            full = model(x)
            decoder = StaticDecoder(model, capacity=14, fused=True)
            parts = [decoder.prefill(x[:, :9])] + [decoder.step(x[:, i:i + 1]).clone() for i in range(9, 14)]
        err = (torch.stack(parts, 1) - full[:, 8:]).abs().max().item()
        ok = err < 1e-4
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} model {arch} power {case}: static decoder on the kernel vs full forward, "
              f"max abs err {err:.1e}", flush=True)
    return failed


def main():
    g = torch.Generator().manual_seed(0)
    failed = run_models() if sys.argv[1:] != ["full"] else 0
    for case in FULL if sys.argv[1:] == ["full"] else QUICK:
        err, floor = run(*case[:10], case[10] if len(case) > 10 else {}, g)
        # within a few times what the plain-torch step loses in fp32 (even p: (q.k)^p summed over signed features
        # cancels, most at p=4) or 2e-6; fp16 inputs: the output's rounding
        tol = 2e-3 if case[-1] == torch.float16 else max(2e-6, 4 * floor)
        ok = err < tol
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} p={case[0]} d={case[1]} gated={case[2]} norm={case[3]} b={case[4]} "
              f"hq={case[5]} hk={case[6]} split={case[7]} block_d={case[8]} {case[9]} {case[10:]}: rel err {err:.2e} "
              f"(fp32 plain-torch step {floor:.2e})", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
