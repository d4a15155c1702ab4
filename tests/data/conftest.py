"""Fixtures: token arrays in the LongCrawl64 layout, in zarr format v3 (zarr 3) and v2 (as zarr 2 wrote it)."""
import pytest
from lc64_fixtures import random_tokens, write_v2_like_zarr2, write_v3


@pytest.fixture(scope="session")
def tokens_small():
    """(50, 100) GPT-2-range ids: N and doc_len not multiples of the usual B and T."""
    return random_tokens(50, 100, seed=1)


@pytest.fixture(scope="session", params=["v3", "v2"])
def lc64_array(request, tmp_path_factory, tokens_small):
    """(path, data): the same tokens as a zarr v3 array and as a zarr-2-written v2 array; chunks (16, 32)."""
    d = tmp_path_factory.mktemp(f"lc64_{request.param}")
    writer = write_v3 if request.param == "v3" else write_v2_like_zarr2
    return writer(d / "train.zarr", tokens_small, (16, 32)), tokens_small
