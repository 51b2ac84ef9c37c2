"""What the two baseline scripts share: the same flags, so throughput.py drives both alike."""

from __future__ import annotations

import argparse
from pathlib import Path


def parse_baseline_args(description: str, batch_help: str = "per rank") -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="default", help="'default' (all-MiniLM-L6-v2) or 'tiny'")
    p.add_argument("--batch-size", type=int, default=16, help=batch_help)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--out-json", type=Path, required=True, help="rank 0 writes the step records here")
    return p.parse_args()
