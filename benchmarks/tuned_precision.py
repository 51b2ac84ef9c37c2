"""The tuned Trainer's precision: whichever of fp32 and bf16 autocast trains this model faster on this CPU.

A careful user tries both and keeps the faster (issue 29's anchor). Fixing bf16=True "whatever the CPU" made the
anchor a straw man where bf16 is emulated: on a 2-vCPU Zen 3 (AVX2 only) bf16 ran 0.08x fp32, and the tuned
Trainer's first paraphrase run had not finished after 13 minutes, where fp32 takes about 3. So throughput.py times
the model's own shapes in both precisions, with corecpu's calibration (the layers' forward and backward and the
AdamW step, rounds alternating), at the tuned Trainer's threads and batch per process, and keeps the faster one,
with no margin: the margin in corecpu's own choice is for corecpu's exactness, not for a user's try-both.

    python benchmarks/tuned_precision.py --model default --threads 1 --batch-size 16 --seq-len 64   # one JSON line
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def faster(bf16_speedup: float) -> str:
    """Pure: the precision a user who timed both keeps (fp32 time / bf16 time)."""
    return "bf16" if bf16_speedup > 1.0 else "fp32"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="default", help="corecpu's --model value: default, tiny or a directory")
    p.add_argument("--threads", type=int, default=1, help="threads of one Trainer process")
    p.add_argument("--batch-size", type=int, default=16, help="examples per Trainer process")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per example in the timed batch")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed rounds (at least 3 rounds, unless the first is decisive)")
    args = p.parse_args()

    import torch

    from corecpu.compute.precision import CalibrationShapes, measure_bf16_speedup
    from corecpu.training.modeling import load_model

    torch.manual_seed(0)
    model, _ = load_model(args.model, ["a", "b"], 0)
    shapes = CalibrationShapes.from_model(model, args.batch_size, args.seq_len)
    ratio = measure_bf16_speedup(shapes, args.threads, budget_s=args.budget)
    print(json.dumps({"precision": faster(ratio), "bf16_speedup": round(ratio, 4), "threads": args.threads,
                      "shapes": shapes.describe(), "method": "corecpu.compute.precision.measure_bf16_speedup, "
                      "the faster precision kept (no margin)"}))


if __name__ == "__main__":
    main()
