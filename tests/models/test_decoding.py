"""Decoding with per-layer caches against recomputing the whole prefix, for every arch x attention pair (CPU, fp32):
the logits of a prompt and of every generated token agree within 1e-4, greedy generation agrees token for token;
the caches are the sizes they should be; sampling options and bad arguments."""
import pytest
import torch

from longctx.models import ATTENTIONS, build_model
from longctx.models.attention.shared import KVCache
from longctx.models.decoding import sample_next
from longctx.models.spec import ARCHS
from _checks import VOCAB, assert_cached_equals_full, perturb_, tiny_spec

CASES = [pytest.param(dict(attention="exp"), id="exp"),
         pytest.param(dict(attention="exp", sink=True), id="exp-sink"),
         pytest.param(dict(attention="exp", rope_dims=8), id="exp-rope8of16"),
         pytest.param(dict(attention="window", window=5), id="window5"),
         pytest.param(dict(attention="linear"), id="linear"),
         pytest.param(dict(attention="power", p=2, gating=False), id="power2-ungated"),
         pytest.param(dict(attention="power", p=2, output_norm=True), id="power2-output_norm")]
CASES += [pytest.param(dict(attention="power", p=p), id=f"power{p}-chunked") for p in (1, 2)]
CASES += [pytest.param(dict(attention="power", p=p, chunk_size=None), id=f"power{p}") for p in (3, 4)]  # big states: quadratic form


def test_cases_cover_every_attention():
    assert {c.values[0]["attention"] for c in CASES} == set(ATTENTIONS)


def model_for(arch, case, seed=0, scale=0.05):
    torch.manual_seed(seed)
    return perturb_(build_model(tiny_spec(arch, **case)), scale, seed=seed).eval()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_logits_equal_full_forward(arch, case):
    """A 9-token prompt (longer than the window of 5), then one token at a time: every position's logits equal
    those of one forward over the whole sequence (rotary positions, gates, states, token shifts all continue)."""
    model = model_for(arch, case)
    x = torch.randint(0, VOCAB, (2, 21))
    full, cache = assert_cached_equals_full(model, x, prompt=9, atol=1e-4)
    assert all(c.pos == 21 for c in cache)
    with torch.no_grad():  # the prompt's last position alone (what generate keeps of a long prompt)
        last = model(x[:, :9], cache=model.new_cache(), last_only=True)
    assert last.shape == (2, 1, full.shape[-1])
    torch.testing.assert_close(last, full[:, 8:9], rtol=0, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generation_cached_equals_recomputed(arch, case):
    model = model_for(arch, case, seed=1, scale=0.2)  # weights far enough from init for varied continuations
    prompt = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(8))
    cached = model.generate(prompt, 14, temperature=0, use_cache=True)
    naive = model.generate(prompt, 14, temperature=0, use_cache=False)
    assert cached.shape == (2, 20) and torch.equal(cached[:, :6], prompt)
    assert torch.equal(cached, naive)
    assert len(set(cached[:, 6:].flatten().tolist())) > 3  # not a degenerate constant continuation


def test_power_state_does_not_grow_and_kv_cache_does():
    power, exp = model_for("gpt2", dict(attention="power", p=2)), model_for("gpt2", dict(attention="exp"))
    sizes = {}
    for name, model in (("power", power), ("exp", exp)):
        cache = model.new_cache()
        with torch.no_grad():
            model(torch.randint(0, VOCAB, (1, 10)), cache=cache)
            first = cache[0].state
            first = first.s.numel() + first.z.numel() if name == "power" else first.length
            for _ in range(30):
                model(torch.randint(0, VOCAB, (1, 1)), cache=cache)
        last = cache[0].state
        sizes[name] = (first, last.s.numel() + last.z.numel() if name == "power" else last.length)
    assert sizes["power"][0] == sizes["power"][1] == power.blocks[0].attn.core.state_size(1) // 1
    assert sizes["exp"] == (10, 40)


def test_rolling_window_cache_stays_bounded():
    cache = KVCache(keep=4)
    seq = torch.arange(50.0).view(1, 50, 1, 1)
    keys, _ = cache.append(seq[:, :7], seq[:, :7])
    assert keys[0, :, 0, 0].tolist() == list(range(7))
    for t in range(7, 50):
        keys, values = cache.append(seq[:, t:t + 1], seq[:, t:t + 1])
        assert keys[0, -4:, 0, 0].tolist() == list(range(t - 3, t + 1))  # the newest four, in order, end at t
        assert cache.nbytes() <= 2 * 11 * 4  # capacity at most max(2 * keep, keep + the prompt's 7)


def test_kv_cache_returned_views_survive_later_appends():
    cache = KVCache()
    keys, _ = cache.append(torch.ones(1, 3, 1, 2), torch.ones(1, 3, 1, 2))
    for _ in range(40):  # several reallocations
        cache.append(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    assert keys.eq(1).all() and cache.length == 43


def test_sampling_options():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert sample_next(logits, 0, None).item() == 1
    assert sample_next(logits, 1.0, top_k=1).item() == 1
    draws = {sample_next(logits, 1.0, 2, torch.Generator().manual_seed(s)).item() for s in range(40)}
    assert draws == {1, 3}  # top_k=2 keeps the two largest logits only
    model = model_for("gpt2", dict(attention="power"))
    prompt = torch.randint(0, VOCAB, (1, 4))
    a = model.generate(prompt, 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    b = model.generate(prompt, 8, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, words", [
    (dict(idx=torch.tensor([[1, VOCAB]])), f"token id {VOCAB} is outside the model's vocabulary 0..{VOCAB - 1}"),
    (dict(idx=torch.tensor([[1, -1]])), "token id -1"),
    (dict(idx=torch.tensor([1, 2])), "idx must be a (batch, seq) integer tensor"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_k=0), "top_k"),
])
def test_bad_generate_arguments_name_themselves(kwargs, words):
    model = model_for("gpt2", dict(attention="exp"))
    args = dict(idx=torch.tensor([[1, 2]]), max_new_tokens=3) | kwargs
    with pytest.raises(ValueError) as err:
        model.generate(**args)
    assert words in str(err.value)
