"""Uniform random 16-bit values for dropout masks, computed on all of a rank's threads.

torch's CPU generator (mt19937) fills a tensor on one thread whatever `torch.get_num_threads()` says: `random_`
runs a serial loop, and so does `bernoulli_` except on Intel CPUs with MKL. At one thread per rank that costs
little, but a rank with 16 threads waits on one of them for every dropout mask: about 0.7 ns an element on one
core, some 100 ms of a BERT-base step at batch 32 x 128, against a step that should take about half a second.

This draws the values from a counter-based hash instead. Word i (two 16-bit values) of a call is
lowbias32(i * a + b mod 2^32), Chris Wellons' 32-bit integer hash (two multiply and three xor-shift rounds), and
(a, b) are 64 bits drawn from torch's generator once per call, with a made odd. The hash is a sequence of torch's
int32 elementwise kernels over chunks that stay in the core's cache, so it runs on every thread of the rank's
OpenMP team (Python threads would share cores with OpenMP's spinning workers: measured no faster after a matmul).

- Reproducible: the values are a function of (a, b) and the position only, not of the thread count, and (a, b)
  come from the default generator, so a seed replays a run and a checkpoint's random state resumes it.
- Calls do not repeat each other: an odd multiplier makes each call's counters distinct, and two calls with
  other multipliers line up at a given offset in O(1) positions, not in runs (an added offset alone would make
  two calls whose offsets differ by less than their length give shifted copies of one stream).
- Faster than mt19937 even on one thread (about 1.4 against 2.0-4.3 ms for 3.1M values on one Zen 5 core),
  1.8x that on two threads. Small calls would pay a fixed cost of about 15 kernel launches, so they draw from
  torch's generator directly (one 64-bit draw per four values), which is as fast as anything at that size.
"""

from __future__ import annotations

import torch

# Words each thread hashes per kernel: 1 MiB of int32 stays in a core's L2 between the rounds. A chunk is this
# times the thread count, so a 16-thread rank launches as few kernels per value as a one-thread rank.
CHUNK_WORDS = 1 << 18
# Below this many values one serial draw beats the hash's ~15 kernel launches: 16K values took 0.06 ms of dropout
# drawn serially against 0.09 hashed, 64K the same, 184K 0.43 against 0.39 (one Zen 5 core, bf16, kernel included).
SERIAL_BELOW = 1 << 16
_MASK32 = 0xFFFFFFFF
# lowbias32: (shift, multiplier) rounds, then a final shift.
_ROUNDS = ((16, 0x7FEB352D), (15, 0x846CA68B))
_FINAL_SHIFT = 16

_counter: torch.Tensor | None = None  # 0, 1, 2, ... as int32, made on first use and grown to the largest chunk


def _signed32(value: int) -> int:
    """`value` mod 2^32 as the int32 torch multiplies and adds with (both wrap the same way)."""
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


def _counters(m: int) -> torch.Tensor:
    global _counter
    if _counter is None or _counter.numel() < m:
        _counter = torch.arange(m, dtype=torch.int32)
    return _counter[:m]


def _xorshift_right(x: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    """x ^= x >>> shift (logical): torch's int32 shift is arithmetic, so the sign bits are masked off."""
    torch.bitwise_right_shift(x, shift, out=scratch)
    scratch.bitwise_and_((1 << (32 - shift)) - 1)
    x.bitwise_xor_(scratch)


def key(generator: torch.Generator | None = None) -> tuple[int, int]:
    """(a, b) for one call: 64 bits from `generator` (torch's default when None), a odd."""
    bits = torch.empty(1, dtype=torch.int64).random_(-(1 << 63), None, generator=generator).item()
    return (bits & _MASK32) | 1, (bits >> 32) & _MASK32


def hash_words(words: int, a: int, b: int) -> torch.Tensor:
    """int32 word i = lowbias32(i * a + b mod 2^32), for i < `words`."""
    out = torch.empty(words, dtype=torch.int32)
    chunk = CHUNK_WORDS * torch.get_num_threads()  # the values do not depend on it: each is a function of i
    scratch = torch.empty(min(words, chunk), dtype=torch.int32)
    multiplier = _signed32(a)
    for start in range(0, words, chunk):
        x = out[start:start + chunk]
        s = scratch[:x.numel()]
        torch.mul(_counters(x.numel()), multiplier, out=x)
        x.add_(_signed32(start * a + b))
        for shift, factor in _ROUNDS:
            _xorshift_right(x, shift, s)
            x.mul_(_signed32(factor))
        _xorshift_right(x, _FINAL_SHIFT, s)
    return out


def random_int16(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """n uniformly distributed int16 values (a 1-D view): hashed from one draw of `generator`, or below
    SERIAL_BELOW values drawn from it directly."""
    if n < SERIAL_BELOW:
        words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None, generator=generator)
        return words.view(torch.int16)[:n]
    a, b = key(generator)
    return hash_words((n + 1) // 2, a, b).view(torch.int16)[:n]
