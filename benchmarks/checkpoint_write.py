"""The resumable checkpoint of a full fine-tuning run, written by 2 ranks on one host: corecpu's against what the
Trainer writes (rank 0: save_pretrained of the model, then torch.save of the optimizer, scheduler and RNG).

    python benchmarks/checkpoint_write.py --model ~/.cache/corecpu/models/llama-135m-v1 --repeats 3 \\
        --out benchmarks/results/checkpoint-write-135m.json

Variants, each in fresh processes (2 ranks under torchrun, gloo), interleaved, medians over --repeats:
  corecpu         corecpu.training.checkpoint_state.save: the ranks on the host write parts of it (shards)
  corecpu_single  the same with one writer (rank 0; what corecpu did before the shards)
  trainer_like    the Trainer's files as its _save_checkpoint writes them on rank 0 (model.safetensors,
                  optimizer.pt, scheduler.pt, rng_state.pt), without corecpu's digests, fsync or atomic rename
The state is real: the model's AdamW state after one step on random tokens. The time is rank 0's, from a barrier
before the save to the barrier after it (the other rank waits at the next collective either way); the second
save of each process is reported too (the first big write of a process can pay for fresh page-cache memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("corecpu", "corecpu_single", "trainer_like")


def worker(variant: str, model_dir: str, out: Path, result: Path) -> None:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup

    sys.path.insert(0, str(ROOT))
    from corecpu.training import checkpoint_shards, checkpoint_state

    if variant == "corecpu_single":
        checkpoint_shards.SHARD_MIN_BYTES = 1 << 62
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    sched = get_linear_schedule_with_warmup(opt, 1, 10)
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    seconds = []
    for step in (1, 2):
        dist.barrier()
        start = time.perf_counter()
        if variant.startswith("corecpu"):
            checkpoint_state.save(out, step=step, model=model, optimizer=opt, scheduler=sched, keep=1)
        elif rank == 0:
            where = out / f"checkpoint-{step}"
            model.save_pretrained(where, safe_serialization=True)
            torch.save(opt.state_dict(), where / "optimizer.pt")
            torch.save(sched.state_dict(), where / "scheduler.pt")
            torch.save({"cpu": torch.get_rng_state()}, where / "rng_state.pt")
        dist.barrier()
        seconds.append(time.perf_counter() - start)
        if step == 1:  # one checkpoint on disk
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    if rank == 0:
        result.write_text(json.dumps({"first_s": seconds[0], "second_s": seconds[1], "bytes": size}))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a causal-LM directory (e.g. the built-in llama-135m's cache)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", type=Path, help="where the JSON goes (required)")
    p.add_argument("--worker", nargs=3, metavar=("VARIANT", "OUT", "RESULT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker[0], a.model, Path(a.worker[1]), Path(a.worker[2]))
    if a.out is None:
        p.error("--out is required")
    runs = []
    torchrun = Path(sys.executable).parent / "torchrun"
    for repeat in range(a.repeats):
        for variant in a.variants.split(","):
            with tempfile.TemporaryDirectory(dir=ROOT) as work:  # the disk checkpoints go to
                result = Path(work) / "result.json"
                subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", __file__, "--model", a.model,
                                "--worker", variant, str(Path(work) / "out"), str(result)], check=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
                runs.append({"variant": variant, "repeat": repeat, **json.loads(result.read_text())})
                print(json.dumps(runs[-1]), flush=True)
    table = {v: {k: statistics.median(r[k] for r in runs if r["variant"] == v) for k in ("first_s", "second_s", "bytes")}
             for v in a.variants.split(",")}
    a.out.write_text(json.dumps({"cpu": _cpu(), "args": vars(a) | {"out": str(a.out)}, "table": table, "runs": runs},
                                indent=1, default=str))
    for v, row in table.items():
        print(f"{v:15s} first save {row['first_s']:.2f} s, second {row['second_s']:.2f} s, {row['bytes'] / 1e9:.2f} GB")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f" x{os.cpu_count()}"
    return "unknown"


if __name__ == "__main__":
    main()
