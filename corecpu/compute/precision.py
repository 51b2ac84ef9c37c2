"""Which precision to train in: fp32, or bf16 autocast, chosen from evidence.

CPU flags cannot say whether bf16 pays: the same avx512_bf16 flag meant 1.5x faster
than fp32 on an AMD EPYC and 0.65x on an Intel Xeon without AMX. So `auto` trusts only
AMX (bf16 tiles are several times fp32 matmul throughput) and otherwise times the
model's own shapes in both precisions once per CPU, caching the ratio on disk.

    shapes = CalibrationShapes.from_model(model, batch_size, seq_len)
    choice = resolve_precision("auto", read_cpu_features(), shapes, threads)   # I/O: cache, timing
    choice = agree_precision(gather_objects(choice))                            # every rank the same

`decide_precision` and `agree_precision` are pure; `resolve_precision` does the I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corecpu import cachefile, envvars, notices
from corecpu.compute import PRECISIONS
from corecpu.errors import CoreCPUError
from corecpu.cpu.hardware import CpuFeatures

# bf16 must be clearly faster: the calibration tracked the real step's ratio within 1-8%, and
# repeated calls spread by up to -20%/+6% on a heavily shared machine (benchmarks/README.md);
# between 1.0 and 1.1 the gain is within that noise, and fp32 is the exact choice.
BF16_MARGIN = 1.10
# A first timed round further than this factor from the margin decides alone: the noise above moves a ratio by
# tens of percent, not 2x. On a CPU that emulates bf16 (AVX2 only) one bf16 step takes 10x an fp32 one, and
# two more rounds of it were half of a first start-up's 7 s calibration (a 2-vCPU Zen 3, benchmarks/README.md).
DECISIVE = 2.0
# A ratio this low on any one shape means the CPU has no fast bf16 path (it computes bf16 through fp32): an
# AVX2-only Zen 3 measured 0.05-0.09x at every sequence length and thread count tried, where CPUs with avx512_bf16
# measured 0.77-3.33x (benchmarks/README.md). So such a ratio, cached for this CPU and torch, decides for every
# shape and thread count: a first run at a new length there spent 5-14 s timing bf16 steps 10x an fp32 one's.
NO_FAST_BF16 = 0.25
# Flags that change how bf16 or fp32 matmuls run; part of the cache key.
KEY_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_fp16")
CACHE_FILE = "precision.json"
CACHE_VERSION = 1


@dataclass(frozen=True)
class PrecisionChoice:
    name: str  # "fp32" or "bf16"
    reason: str  # one short phrase for the start-up line
    warning: str | None = None
    bf16_speedup: float | None = None  # fp32 time / bf16 time, when measured (or cached)
    source: str = "requested"  # "requested" | "amx" | "measured" | "cached"

    @property
    def autocast_dtype(self):  # torch.dtype | None; torch is imported lazily so `corecpu plan` stays fast
        import torch

        return torch.bfloat16 if self.name == "bf16" else None

    def to_dict(self) -> dict[str, Any]:
        """What config.json records under "resolved"."""
        return {"precision": self.name, "bf16_speedup": self.bf16_speedup, "source": self.source,
                "reason": self.reason}


# ---------------------------------------------------------------- pure decisions

def has_amx(features: CpuFeatures) -> bool:
    # read_cpu_features keeps amx_* only where the kernel lists them, i.e. where AMX is usable.
    return "amx_bf16" in features.flags


def _valid(ratio: Any) -> float | None:
    """A usable speed-up ratio, or None (missing, not a number, not finite, not positive)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        return None
    return float(ratio) if math.isfinite(ratio) and ratio > 0 else None


def decide_precision(requested: str, features: CpuFeatures, bf16_speedup: float | None = None, *,
                     cached: bool = False, other_shape: bool = False, margin: float = BF16_MARGIN) -> PrecisionChoice:
    """Pure: the precision for `requested` on this CPU, given the measured bf16 speed-up (or None); `other_shape`:
    it was measured on another shape (NO_FAST_BF16)."""
    if requested not in PRECISIONS:
        raise CoreCPUError(f"unknown precision {requested!r}; use one of: {', '.join(PRECISIONS)}")
    ratio = _valid(bf16_speedup)
    source = "cached" if cached else "measured"
    note = " (cached, from another shape: no fast bf16 path on this CPU)" if other_shape else " (cached)"
    where = f"on {features.model_name}{note if cached else ''}"
    if requested == "fp32":
        return PrecisionChoice("fp32", "requested", bf16_speedup=ratio)
    if requested == "bf16":
        warning = None
        if ratio is not None and ratio < 1.0:
            warning = (f"bf16 measured {ratio:.2f}x the speed of fp32 {where}: training will be slower; "
                       "use precision auto or fp32")
        elif ratio is None and not features.has_native_bf16:
            warning = ("bf16 forced on a CPU without amx_bf16/avx512_bf16: PyTorch emulates it and training "
                       "will be about 2x slower than fp32; use precision auto or fp32")
        return PrecisionChoice("bf16", "requested", warning, ratio)
    if has_amx(features):
        return PrecisionChoice("bf16", "CPU has AMX (amx_bf16)", bf16_speedup=ratio, source="amx")
    if ratio is None:
        return PrecisionChoice("fp32", "bf16 speed not measured; fp32 is the safe default", source="measured")
    if ratio >= margin:
        return PrecisionChoice("bf16", f"measured bf16 {ratio:.2f}x fp32 {where}", bf16_speedup=ratio, source=source)
    return PrecisionChoice("fp32", f"measured bf16 {ratio:.2f}x fp32 {where}, below the {margin:.2f}x needed",
                           bf16_speedup=ratio, source=source)


def agree_precision(choices: Sequence[PrecisionChoice]) -> PrecisionChoice:
    """Pure: one precision for all ranks from each rank's own choice (rank order).

    DDP steps at the pace of the slowest rank, so bf16 only if every rank chose it; the
    smallest measured speed-up is the one reported. Requests are the same on every rank,
    so ranks can only disagree under auto on mixed CPUs, and then fp32 is the safe side.
    """
    if not choices:
        raise ValueError("agree_precision needs at least one rank's choice")
    measured = [c for c in choices if c.bf16_speedup is not None]
    slowest = min(measured, key=lambda c: c.bf16_speedup) if measured else choices[0]
    names = Counter(c.name for c in choices)
    if len(names) == 1:
        return slowest
    fp32 = next(c for c in choices if c.name == "fp32")
    return dataclasses.replace(fp32, bf16_speedup=slowest.bf16_speedup,
                               reason=f"bf16 faster on {names['bf16']} of {len(choices)} ranks only; "
                                      f"fp32 on all ({fp32.reason})")


def typical_batch_length(lengths: Sequence[int], batch_size: int, multiple: int = 32) -> int:
    """Pure: about how wide a batch padded to its longest item is, rounded up to `multiple`.

    The longest of b random items sits near the b/(b+1) quantile of the lengths; rounding
    keeps the cache key stable across datasets of similar lengths.
    """
    if not lengths:
        return multiple
    ordered = sorted(lengths)
    q = ordered[min(len(ordered) - 1, int(len(ordered) * batch_size / (batch_size + 1)))]
    return max(multiple, -(-q // multiple) * multiple)


# ---------------------------------------------------------------- what to time

@dataclass(frozen=True)
class CalibrationShapes:
    """The matmul work of one training step, as shapes: a transformer encoder's, or a generic model's Linears."""

    batch_size: int
    seq_len: int
    hidden_size: int = 0  # encoder layers, when the model has a HF config; 0: use `linears`
    intermediate_size: int = 0
    num_heads: int = 0
    num_layers: int = 0
    dropout: float = 0.1
    linears: tuple[tuple[int, int, int], ...] = ()  # (in_features, out_features, how many) outside encoder layers
    num_params: int = 0  # the optimizer updates these in fp32 in both precisions

    @classmethod
    def from_config(cls, config: Any, batch_size: int, seq_len: int, num_params: int = 0) -> "CalibrationShapes":
        """From a Hugging Face config with hidden_size, intermediate_size, num_attention_heads, num_hidden_layers."""
        hidden = int(config.hidden_size)
        return cls(batch_size, seq_len, hidden_size=hidden,
                   intermediate_size=int(getattr(config, "intermediate_size", 0) or 4 * hidden),
                   num_heads=int(config.num_attention_heads), num_layers=int(getattr(config, "num_hidden_layers", 1)),
                   dropout=float(getattr(config, "hidden_dropout_prob", 0.1) or 0.0), num_params=num_params)

    @classmethod
    def from_model(cls, model: Any, batch_size: int, seq_len: int) -> "CalibrationShapes":
        """From a HF model's config when it has the encoder fields, else from the module's own Linear layers."""
        import torch

        num_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        config = getattr(model, "config", None)
        if config is not None and all(hasattr(config, k) for k in ("hidden_size", "num_attention_heads")):
            return cls.from_config(config, batch_size, seq_len, num_params)
        counts = Counter((m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear))
        if not counts:
            raise CoreCPUError("cannot calibrate precision for a model without Linear layers or a transformer "
                               "config; choose the precision explicitly (fp32 or bf16)")
        return cls(batch_size, seq_len, linears=tuple(sorted((i, o, n) for (i, o), n in counts.items())),
                   num_params=num_params)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    def describe(self) -> str:
        if self.hidden_size:
            body = (f"{self.num_layers} x encoder layer {self.hidden_size}/{self.intermediate_size}/"
                    f"{self.num_heads} heads")
        else:
            body = f"{sum(n for _, _, n in self.linears)} Linear layers"
        return f"{body}, batch {self.batch_size} x {self.seq_len} tokens, {self.num_params} parameters"


def _workloads(shapes: CalibrationShapes) -> list[tuple[Callable[[], None], int]]:
    """(forward+backward closure, times per step); each distinct shape is built once and weighted."""
    import torch

    torch.manual_seed(0)
    work: list[tuple[Callable[[], None], int]] = []

    def fwd_bwd(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
        params = [x, *module.parameters()]

        def run() -> None:
            module(x).float().sum().backward()
            for p in params:  # as zero_grad(set_to_none=True): the next backward writes, not accumulates
                p.grad = None
        return run

    if shapes.hidden_size:
        # nn.TransformerEncoderLayer is a BERT layer: attention through scaled_dot_product_attention,
        # GELU MLP, post-LayerNorm, dropout; under autocast its casts cost what the real model's do.
        layer = torch.nn.TransformerEncoderLayer(shapes.hidden_size, shapes.num_heads, shapes.intermediate_size,
                                                 dropout=shapes.dropout, activation="gelu", batch_first=True).train()
        x = torch.randn(shapes.batch_size, shapes.seq_len, shapes.hidden_size, requires_grad=True)
        work.append((fwd_bwd(layer, x), max(1, shapes.num_layers)))
    for fin, fout, n in shapes.linears:
        x = torch.randn(shapes.tokens, fin, requires_grad=True)
        work.append((fwd_bwd(torch.nn.Linear(fin, fout), x), n))
    if shapes.num_params:
        # The fp32 share that bf16 does not speed up: a fused AdamW step over the trainable parameters.
        p = torch.nn.Parameter(torch.zeros(shapes.num_params))
        p.grad = torch.full_like(p, 1e-3)
        opt = torch.optim.AdamW([p], lr=1e-5, fused=True)
        work.append((lambda: opt.step(), 1))  # autocast leaves it alone: same work in both precisions
    return work


def measure_bf16_speedup(shapes: CalibrationShapes, threads: int, budget_s: float = 0.5,
                         min_rounds: int = 3, max_rounds: int = 20) -> float:
    """fp32 time / bf16-autocast time of one training step's work, on `threads` threads.

    Rounds alternate the order of the two precisions and repeat until `budget_s` is spent
    (at least `min_rounds`, unless the first is decisive: alternate_rounds); the ratio is of the per-precision
    medians.
    """
    import torch

    old_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        # fork_rng: the random inputs and dropout here must not shift the training run's random stream.
        with torch.random.fork_rng(devices=[]):
            work = _workloads(shapes)
            # One thread computes in this thread, and its CPU time ignores other processes sharing the
            # core; with a pool, wall time is what the step will take.
            clock = time.thread_time if threads <= 1 else time.perf_counter

            def one(bf16: bool) -> float:
                total = 0.0
                for run, weight in work:
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        start = clock()
                        run()
                        total += (clock() - start) * weight
                return total

            one(False), one(True)  # first calls pick oneDNN kernels and grow the allocator
            fp32, bf16 = alternate_rounds(one, budget_s=budget_s, min_rounds=min_rounds, max_rounds=max_rounds)
            return statistics.median(fp32) / statistics.median(bf16)
    finally:
        torch.set_num_threads(old_threads)


def alternate_rounds(one: Callable[[bool], float], *, budget_s: float, min_rounds: int, max_rounds: int,
                     margin: float = BF16_MARGIN, decisive: float = DECISIVE,
                     now: Callable[[], float] = time.perf_counter) -> tuple[list[float], list[float]]:
    """The fp32 and bf16 times of rounds that alternate which precision goes first (`one(bf16)` times one), until
    `budget_s` has passed and `min_rounds` are in, or `max_rounds`; or after the first round, when its ratio lies
    beyond `decisive` times the margin either way (more rounds could not move it across the margin)."""
    fp32: list[float] = []
    bf16: list[float] = []
    deadline = now() + budget_s
    for r in range(max_rounds):
        for is_bf16 in ((False, True) if r % 2 == 0 else (True, False)):
            (bf16 if is_bf16 else fp32).append(one(is_bf16))
        if r == 0 and bf16[0] > 0:
            ratio = fp32[0] / bf16[0]
            if ratio < margin / decisive or ratio > margin * decisive:
                break
        if r + 1 >= min_rounds and now() >= deadline:
            break
    return fp32, bf16


# ---------------------------------------------------------------- cache

def _cpu_key(features: CpuFeatures, torch_version: str) -> str:
    flags = ",".join(f for f in KEY_FLAGS if f in features.flags)
    return f"{features.model_name} | {flags} | torch {torch_version} | "


def cache_key(features: CpuFeatures, torch_version: str, threads: int, shapes: CalibrationShapes) -> str:
    """Readable and unique: a ratio measured for one CPU, torch, thread count and model shape."""
    what = json.dumps(dataclasses.asdict(shapes), sort_keys=True)
    digest = hashlib.sha256(what.encode()).hexdigest()[:12]
    return f"{_cpu_key(features, torch_version)}{threads} threads | shapes {digest}"


def read_cache(path: Path) -> dict[str, dict[str, Any]]:
    """Entries by key; a missing, unreadable or corrupt file reads as empty (it is rewritten on the next store)."""
    return cachefile.read_entries(path, CACHE_VERSION)


def cached_speedup(path: Path, key: str) -> float | None:
    """The cached ratio for `key`; a damaged entry counts as missing (it is measured again and replaced)."""
    entry = read_cache(path).get(key)
    if not entry:
        return None
    ratio = _valid(entry.get("bf16_speedup"))
    if ratio is None:
        notices.warn(f"ignoring the damaged precision calibration in {path} (bf16_speedup "
                     f"{entry.get('bf16_speedup')!r}); measuring again", per_host=True)
    return ratio


def no_fast_bf16(path: Path, features: CpuFeatures, torch_version: str) -> float | None:
    """The lowest ratio below NO_FAST_BF16 cached for this CPU and torch at any shape or thread count, or None."""
    prefix = _cpu_key(features, torch_version)
    ratios = [_valid(e.get("bf16_speedup")) for k, e in read_cache(path).items() if k.startswith(prefix)
              and isinstance(e, dict)]
    slow = [r for r in ratios if r is not None and r < NO_FAST_BF16]
    return min(slow) if slow else None


def store_cache(path: Path, key: str, entry: dict[str, Any]) -> bool:
    """Add one entry atomically (temp file + rename); an unwritable directory warns once and returns False."""
    return cachefile.store_entry(path, CACHE_VERSION, key, entry, what="the precision calibration")


# ---------------------------------------------------------------- I/O: the whole decision

def resolve_precision(requested: str, features: CpuFeatures, shapes: CalibrationShapes, threads: int,
                      cache_dir: Path | None = None, *, budget_s: float = 0.5,
                      measure: Callable[..., float] = measure_bf16_speedup) -> PrecisionChoice:
    """This rank's precision: fp32 as asked; bf16 as asked (a cached measurement can add a warning);
    auto: AMX means bf16, else the cached ratio, a ratio cached on another shape that shows no fast bf16 path
    (NO_FAST_BF16), or a fresh calibration (then cached) decides.

    Each rank can call this at once on its own cores; then agree_precision over all ranks' choices.
    """
    if requested not in PRECISIONS:
        return decide_precision(requested, features)  # raises the one-line error
    if requested == "fp32":
        return decide_precision("fp32", features)
    import torch

    path = (cache_dir or envvars.cache_dir()) / CACHE_FILE
    key = cache_key(features, torch.__version__, threads, shapes)
    ratio = cached_speedup(path, key)
    if requested == "bf16" or has_amx(features) or ratio is not None:
        return decide_precision(requested, features, ratio, cached=ratio is not None)
    slow = no_fast_bf16(path, features, torch.__version__)
    if slow is not None:  # not stored under this key: only a measurement of this shape is
        return decide_precision(requested, features, slow, cached=True, other_shape=True)
    start = time.perf_counter()
    with notices.phase(f"timing bf16 against fp32 on this model (batch {shapes.batch_size} x {shapes.seq_len} tokens; "
                       "once per CPU model and shape)"):
        ratio = measure(shapes, threads, budget_s)
    seconds = time.perf_counter() - start
    store_cache(path, key, {"bf16_speedup": ratio, "calibration_s": round(seconds, 3), "shapes": shapes.describe(),
                            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return decide_precision(requested, features, ratio)
