"""corecpu.compute.counter_random: the hash is lowbias32 of a Weyl sequence (checked against numpy's unsigned
arithmetic), its values are uniform and unrelated from one position or call to the next, and they depend on the
generator's state only, not on the thread count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corecpu.compute import counter_random
from corecpu.compute.counter_random import CHUNK_WORDS, SERIAL_BELOW, hash_words, key, random_int16


def _reference(words: int, a: int, b: int) -> np.ndarray:
    """lowbias32(i * a + b mod 2^32) in uint64 arithmetic, masked to 32 bits: no signed wrap-around involved."""
    x = (np.arange(words, dtype=np.uint64) * np.uint64(a) + np.uint64(b)) & np.uint64(0xFFFFFFFF)
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x ^= x >> np.uint64(shift)
        x = (x * np.uint64(factor)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    return x.astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a,b", [(1, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0x9E3779B9, 0x7F4A7C15)])
def test_torchs_int32_kernels_compute_the_hash_exactly(threads: int, a: int, b: int) -> None:
    # torch's int32 multiply and add must wrap modulo 2^32 and its masked shift must act as a logical one,
    # in the vectorised body and the scalar tail alike, across chunk boundaries (a chunk per thread count).
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        for words in (1, 5, CHUNK_WORDS * threads - 1, 2 * CHUNK_WORDS * threads + 13):
            assert np.array_equal(hash_words(words, a, b).numpy(), _reference(words, a, b)), words
    finally:
        torch.set_num_threads(before)


def test_the_key_is_odd_and_comes_from_the_generator() -> None:
    g = torch.Generator().manual_seed(3)
    first = [key(g) for _ in range(50)]
    assert all(a % 2 == 1 and 0 < a < 1 << 32 and 0 <= b < 1 << 32 for a, b in first)
    assert len(set(first)) == 50
    assert key(torch.Generator().manual_seed(3)) == first[0]


@pytest.mark.parametrize("n", [SERIAL_BELOW - 3, 1 << 20])
def test_values_are_uniform_and_unrelated_to_their_neighbours_and_the_next_call(n: int) -> None:
    torch.manual_seed(11)
    values = random_int16(n).double()
    following = random_int16(n).double()
    assert values.shape == (n,)
    sigma = 1 / n ** 0.5
    counts = torch.histc(values, bins=16, min=-32768, max=32767)
    expected = n / 16
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 45  # 15 degrees of freedom: p < 1e-4 above 45

    def corr(x: torch.Tensor, y: torch.Tensor) -> float:
        return torch.corrcoef(torch.stack([x, y]))[0, 1].item()
    for lag in (1, 2, 3, 4):  # within a word, across words, and the next word's halves
        assert abs(corr(values[:-lag], values[lag:])) < 5 * sigma
    assert abs(corr(values, following)) < 5 * sigma
    # The low bit of each half (the part a weak hash leaves least mixed) is fair too.
    assert abs((values.long() & 1).double().mean().item() - 0.5) < 2.5 * sigma


def test_the_values_do_not_depend_on_the_thread_count() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = random_int16(3 * CHUNK_WORDS, torch.Generator().manual_seed(5))
        torch.set_num_threads(2)
        two = random_int16(3 * CHUNK_WORDS, torch.Generator().manual_seed(5))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_each_call_takes_one_draw_from_the_default_generator() -> None:
    torch.manual_seed(9)
    random_int16(1 << 18)
    after_hash = torch.rand(3)
    torch.manual_seed(9)
    torch.empty(1, dtype=torch.int64).random_(-(1 << 63), None)
    assert torch.equal(torch.rand(3), after_hash)


def test_the_counter_table_is_made_once_and_grown_only_for_a_larger_chunk() -> None:
    random_int16(2 * SERIAL_BELOW)
    table = counter_random._counter
    random_int16(SERIAL_BELOW)
    assert table is not None and counter_random._counter is table
    random_int16(8 * CHUNK_WORDS * torch.get_num_threads())
    assert counter_random._counter.numel() == CHUNK_WORDS * torch.get_num_threads()
