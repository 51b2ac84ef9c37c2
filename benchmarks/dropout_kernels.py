"""Dropout kernels at a rank's thread counts: corecpu's `fast` kernel, torch's, and the fast kernel's former draw.

    python benchmarks/dropout_kernels.py --threads 1,2 --out benchmarks/results/dropout-kernels-HOST.json
    python benchmarks/dropout_kernels.py --threads 1,4,16 --batch 32 --seq 128   # a 16-core node, BERT-base shapes

Each kernel runs forward and backward on a bf16 tensor of a BERT-base step's two dropout shapes (hidden states,
batch x seq x 768, and attention probabilities, batch x 12 x seq x seq), right after a 768 x 768 matmul on the
same tokens so OpenMP's workers are awake and spinning, as they are inside a step. The matmul's own median is
subtracted. Kernels are interleaved within each repeat; medians of the repeats.

`fast_serial` is the fast kernel as it was before commit 'dropout: draw on every thread' (64-bit mt19937 draws,
serial): the same mask rule, its bits from `random_`. It is here to show what the hashed draw changed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from corecpu.compute.dropout import _LEVELS as LEVELS, _FastDropout, drop_threshold

P = 0.1


class _SerialDraw(torch.autograd.Function):
    """The fast kernel with its former bits: a quarter as many 64-bit mt19937 draws as elements, on one thread."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dropped: int) -> torch.Tensor:  # type: ignore[override]
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
        keep = bits.view(torch.int16)[:n].view(x.shape) >= dropped - (LEVELS >> 1)
        mask = keep.to(x.dtype).mul_(LEVELS / (LEVELS - dropped))
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        mask, = ctx.saved_tensors
        return grad * mask, None


def kernels() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    dropped = drop_threshold(P)
    return {"fast": lambda x: _FastDropout.apply(x, dropped),
            "torch": lambda x: torch.nn.functional.dropout(x, P, True),
            "fast_serial": lambda x: _SerialDraw.apply(x, dropped)}


def time_one(kernel: Callable[[torch.Tensor], torch.Tensor] | None, x: torch.Tensor, tokens: torch.Tensor,
             weight: torch.Tensor) -> float:
    start = time.perf_counter()
    tokens @ weight
    if kernel is not None:
        out = kernel(x)
        out.backward(torch.ones_like(out))
    return time.perf_counter() - start


def measure(threads: int, batch: int, seq: int, repeats: int) -> dict[str, dict[str, float]]:
    torch.set_num_threads(threads)
    shapes = {"hidden": (batch, seq, 768), "attention": (batch, 12, seq, seq)}
    tokens = torch.randn(batch * seq, 768, dtype=torch.bfloat16)
    weight = torch.randn(768, 768, dtype=torch.bfloat16)
    result: dict[str, dict[str, float]] = {}
    for shape_name, shape in shapes.items():
        x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
        runs: dict[str, list[float]] = {name: [] for name in ["matmul", *kernels()]}
        for name, kernel in kernels().items():  # warm-up
            time_one(kernel, x, tokens, weight)
        for _ in range(repeats):
            runs["matmul"].append(time_one(None, x, tokens, weight))
            for name, kernel in kernels().items():
                runs[name].append(time_one(kernel, x, tokens, weight))
        base = statistics.median(runs["matmul"])
        result[shape_name] = {name: round((statistics.median(t) - base) * 1e3, 3)
                              for name, t in runs.items() if name != "matmul"}
        result[shape_name]["elements"] = x.numel()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1", help="comma list of thread counts")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    report = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "p": P,
              "batch": args.batch, "seq": args.seq, "repeats": args.repeats, "ms_forward_and_backward": {}}
    for threads in (int(t) for t in args.threads.split(",")):
        report["ms_forward_and_backward"][str(threads)] = row = measure(threads, args.batch, args.seq, args.repeats)
        for shape_name, times in row.items():
            print(f"threads {threads:>2} {shape_name:>9} ({times['elements']:>9,} values): "
                  + "  ".join(f"{k} {v:7.2f} ms" for k, v in times.items() if k != "elements"), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
