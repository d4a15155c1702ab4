"""The MQAR generator checked against an independent reading of its documents: every query's target is the value
paired with its key earlier in the same document, an oracle that reads the pairs is exactly right, a constant
guess scores exactly its share of the targets, and bad parameters are refused naming the field."""
import numpy as np
import pytest
import zarr

from longctx.data import dataset_info
from longctx.data.mqar import (QUERIES_FILE, dense_ctx, ensure_mqar, generator_params, query_accuracy, read_queries,
                               token_ids)

SMALL = dict(n_keys=32, n_values=16, n_pairs=8, n_queries=6, doc_len=96, n_train=40, n_heldout=24)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = ensure_mqar(tmp_path_factory.mktemp("mqar"), progress=False, **SMALL)
    tokens = np.asarray(zarr.open_array(str(root / "heldout.zarr"), mode="r")[:]).astype(np.int64)
    return root, tokens, read_queries(root)


def read_pairs(doc, n_pairs):
    return {int(doc[2 * i]): int(doc[2 * i + 1]) for i in range(n_pairs)}


def oracle(tokens, n_pairs, n_keys, filler):
    """Next-token guesses from the document alone: after a key past the pairs, that key's value; else the filler."""
    guess = np.full_like(tokens, filler)
    for i, doc in enumerate(tokens):
        pairs = read_pairs(doc, n_pairs)
        for t in range(2 * n_pairs + 1, doc.shape[0]):
            if doc[t - 1] < n_keys:
                guess[i, t] = pairs[int(doc[t - 1])]
    return guess


def test_every_query_asks_a_key_of_its_document_and_is_followed_by_its_value(small):
    root, tokens, queries = small
    filler = token_ids(generator_params(**SMALL))["filler"]
    N, Q = SMALL["n_pairs"], SMALL["n_queries"]
    assert tokens.shape == (SMALL["n_heldout"], SMALL["doc_len"]) and queries.shape == (SMALL["n_heldout"], 2, Q)
    for doc, (pos, dist) in zip(tokens, queries):
        pairs = read_pairs(doc, N)
        assert len(pairs) == N                                         # distinct keys
        assert all(k < SMALL["n_keys"] <= v < SMALL["n_keys"] + SMALL["n_values"] for k, v in pairs.items())
        asked = [t for t in range(2 * N, len(doc)) if doc[t] < SMALL["n_keys"]]
        assert sorted(pos.tolist()) == [t + 1 for t in asked]           # the stored positions are the queries'
        for t in asked:
            assert doc[t + 1] == pairs[int(doc[t])]                     # the target is the key's paired value
        value_pos = {k: 2 * i + 1 for i, k in enumerate(int(doc[2 * i]) for i in range(N))}
        for p, d in zip(pos, dist):
            assert p > 2 * N and d == p - value_pos[int(doc[p - 1])] and d > 0  # queries follow their pair
        others = set(range(2 * N, len(doc))) - set(asked) - {t + 1 for t in asked}
        assert all(doc[t] == filler for t in others)
    assert len({int(k) for doc, (pos, _) in zip(tokens, queries) for k in doc[pos - 1]}) > N  # keys vary


def test_oracle_is_exactly_right_and_a_constant_guess_scores_its_share(small):
    root, tokens, queries = small
    ids = token_ids(generator_params(**SMALL))
    perfect = oracle(tokens, SMALL["n_pairs"], SMALL["n_keys"], ids["filler"])
    assert np.array_equal(query_accuracy(perfect, tokens, queries), np.ones(len(tokens)))
    value = SMALL["n_keys"] + 3
    constant = np.full_like(tokens, value)
    share = [np.mean([doc[p] == value for p in pos]) for doc, (pos, _) in zip(tokens, queries)]
    assert np.array_equal(query_accuracy(constant, tokens, queries), np.asarray(share))
    # averaged over documents, a constant guess sits at the chance level 1 / n_values
    chance, n = 1 / SMALL["n_values"], queries[:, 0].size
    assert abs(np.mean(share) - chance) < 4 * np.sqrt(chance * (1 - chance) / n)  # within 4 standard errors


def test_layout_and_determinism(small, tmp_path):
    root, tokens, queries = small
    info = dataset_info(root / "train.zarr")
    ids = token_ids(generator_params(**SMALL))
    assert (info["bos_id"], info["vocab_size"], info["doc_len"]) == (ids["bos"], ids["vocab_size"], SMALL["doc_len"])
    assert zarr.open_array(str(root / "heldout.zarr"), mode="r").attrs["queries"] == QUERIES_FILE
    again = ensure_mqar(tmp_path, progress=False, **SMALL)
    assert again.name == root.name
    assert np.array_equal(np.asarray(zarr.open_array(str(again / "heldout.zarr"), mode="r")[:]), tokens)
    other = ensure_mqar(tmp_path, progress=False, **dict(SMALL, seed=1))
    assert other.name != root.name
    assert not np.array_equal(np.asarray(zarr.open_array(str(other / "heldout.zarr"), mode="r")[:]), tokens)


def test_power_law_queries_sit_nearer_their_pairs_than_uniform_ones(tmp_path):
    params = dict(SMALL, doc_len=512, n_heldout=64)
    near = read_queries(ensure_mqar(tmp_path, progress=False, distance="power", **params))[:, 1]
    spread = read_queries(ensure_mqar(tmp_path, progress=False, distance="uniform", **params))[:, 1]
    assert np.median(near) < np.median(spread) / 2


@pytest.mark.parametrize("change, field", [
    (dict(n_pairs=40), "data.n_pairs=40"),                       # more pairs than keys
    (dict(n_pairs=30, n_keys=64, n_queries=30), "data.n_pairs=30"),  # 120 tokens > doc_len 96
    (dict(n_keys=40000, n_values=30000), "data.n_keys + data.n_values"),
    (dict(distance="zipf"), "data.distance"),
    (dict(power_a=0.0), "data.power_a"),
    (dict(n_queries=0), "data.n_queries"),
    (dict(seed=-1), "data.gen_seed"),                            # the config's name for the generator's seed
])
def test_bad_parameters_name_the_field_and_write_nothing(tmp_path, change, field):
    with pytest.raises(ValueError, match=field.replace("+", r"\+")) as err:
        ensure_mqar(tmp_path / "cache", progress=False, **dict(SMALL, **change))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cache").exists()


def test_query_positions_from_the_tokens_alone_are_the_stored_queries(small):
    """The training loss's mask (data.loss_on=queries) finds the queried values without the heldout query record:
    it must mark exactly the stored value positions, and the masked targets keep exactly those values."""
    import torch

    from longctx.data.mqar import IGNORE, query_positions, query_targets

    root, tokens, queries = small
    mask = query_positions(tokens, SMALL["n_keys"], SMALL["n_values"], SMALL["n_pairs"])
    stored = np.zeros_like(mask)
    stored[np.arange(len(tokens))[:, None], queries[:, 0]] = True
    assert (mask == stored).all() and mask.sum() == SMALL["n_heldout"] * SMALL["n_queries"]
    batch = {"inputs": torch.zeros(tokens.shape, dtype=torch.long), "targets": torch.from_numpy(tokens)}
    kept = query_targets(batch, SMALL["n_keys"], SMALL["n_values"], SMALL["n_pairs"])["targets"].numpy()
    assert (kept[stored] == tokens[stored]).all() and (kept[~stored] == IGNORE).all()


@pytest.mark.parametrize("n_pairs, n_queries, ctx, expected", [
    (16, None, None, 64), (64, None, 4096, 256), (1024, None, 4096, 4096), (1024, None, 1024, 1024),
    (17, None, None, 128), (16, 48, None, 128), (1, None, None, 4)])
def test_dense_ctx_is_the_shortest_power_of_two_holding_the_pairs_and_queries(n_pairs, n_queries, ctx, expected):
    assert dense_ctx(n_pairs, n_queries, ctx) == expected
    q = n_pairs if n_queries is None else n_queries
    if ctx is None or expected < ctx:   # not capped: the generator fits the document there, and not at half of it
        generator_params(n_keys=2048, n_values=8, n_pairs=n_pairs, n_queries=q, doc_len=expected, n_train=1,
                         n_heldout=1)
        with pytest.raises(ValueError, match="do not fit a document"):
            generator_params(n_keys=2048, n_values=8, n_pairs=n_pairs, n_queries=q, doc_len=expected // 2,
                             n_train=1, n_heldout=1)


def test_dense_ctx_in_configs_and_its_bad_input():
    from omegaconf import OmegaConf

    import longctx  # noqa: F401 -- registers the resolver

    cfg = OmegaConf.create({"n": 64, "ctx": 4096, "c": "${longctx.mqar_dense_ctx:${n},null,${ctx}}"})
    assert cfg.c == 256
    with pytest.raises(ValueError, match="data.n_pairs: must be a positive integer, got 0"):
        dense_ctx(0)
    with pytest.raises(ValueError, match="ctx: must be a positive integer"):
        dense_ctx(4, None, -1)
