"""Image classification: ResNet-50 on generated images, on corecpu's front door, with samples/s and MFU.

    ./launch.sh 2 examples/image_classification.py --steps 50                 # ResNet-50, 224 px, 2 ranks
    ./launch.sh 2 examples/image_classification.py --image-size 128 --compile
    ./launch.sh 2 examples/image_classification.py --model tiny --image-size 32 --steps 20
    ./launch.sh 2 examples/image_classification.py --resume                   # continue from the newest checkpoint

The model is transformers' ResNetForImageClassification built from a config (nothing to download):
its default config is ResNet-50 v1.5 (bottleneck blocks, depths 3-4-6-3, the stride on the 3x3
convolution), with exactly torchvision's resnet50 parameter count (25,557,032 at 1000 labels).
torchvision is not used: its only wheel reachable here is a CUDA build that does not load beside
the CPU torch. `--model tiny` is a one-block-per-stage version for tests.

The images are generated, the same on every rank and every run: each class is a fixed random
low-frequency colour pattern; an image is its class's pattern shifted at random plus pixel noise,
kept as uint8 (as a decoded JPEG is) and normalised to float as real loaders do. A held-out split
(other noise and shifts) gives the accuracy, counted on every rank and summed.

Rank 0 prints a JSON line per logged step (step, loss, global samples, seconds since the loop
started) and a summary: samples/s after the first --warmup steps, eval accuracy, and MFU: the
convolution and matmul FLOPs of one trained sample (torch's FlopCounterMode, forward + backward)
times samples/s, over the job's matmul rate (corecpu.compute.flops: measured once per machine, cached).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import ResNetConfig, ResNetForImageClassification

import corecpu

TRAIN_SIZE = 50_000  # generated on the fly: length costs nothing; runs rarely finish an epoch
MEAN, STD = 0.5, 0.25  # per-channel normalisation, as torchvision's Normalize with the data's statistics


# ---------------------------------------------------------------- data

class SyntheticImages(Dataset):
    """`size` labelled images of `num_classes` balanced classes (item i has label i % num_classes).

    The class patterns depend on `seed` only, so both splits share them; each item's shift and noise
    come from its own generator (seed, split, index): the same item on any rank, in any order."""

    def __init__(self, size: int, num_classes: int, image_size: int, seed: int = 0, split: str = "train") -> None:
        g = torch.Generator().manual_seed(seed)
        grid = torch.rand(num_classes, 3, 4, 4, generator=g)  # a 4x4 grid of colours per class
        self.patterns = F.interpolate(grid, size=(image_size, image_size), mode="bicubic", align_corners=False)
        self.size, self.num_classes, self.image_size = size, num_classes, image_size
        # Disjoint item seeds per (seed, split), below 2**32: torch's CPU generator keeps only 32 bits of a seed.
        self.first_seed = (seed * 2 + (split == "eval")) * 2**24
        if size > 2**24 or self.first_seed >= 2**32 - 2**24:
            raise SystemExit(f"image_classification.py: error: {size} images at seed {seed}; "
                             "use fewer than 2**24 images and a seed below 128")

    def __len__(self) -> int:
        return self.size

    def pixels(self, i: int) -> tuple[torch.Tensor, int]:
        """Item i as (3, H, W) uint8 and its label."""
        label = i % self.num_classes
        g = torch.Generator().manual_seed(self.first_seed + i)
        most = max(1, self.image_size // 8)
        dy, dx = torch.randint(-most, most + 1, (2,), generator=g).tolist()
        image = torch.roll(self.patterns[label], shifts=(dy, dx), dims=(1, 2))
        image = 0.25 + 0.5 * image + 0.25 * torch.randn(image.shape, generator=g)  # classes overlap; noise is large
        return (image.clamp(0, 1) * 255).round().to(torch.uint8), label

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        pixels, label = self.pixels(i)
        return (pixels.float() / 255 - MEAN) / STD, label


# ---------------------------------------------------------------- model and its cost

def build_model(name: str, num_classes: int) -> ResNetForImageClassification:
    if name == "resnet50":
        config = ResNetConfig(num_labels=num_classes)  # the defaults are ResNet-50 v1.5
    elif name == "tiny":
        config = ResNetConfig(num_labels=num_classes, depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256],
                              embedding_size=16)
    else:
        raise SystemExit(f"image_classification.py: error: --model {name!r} is not resnet50 or tiny")
    return ResNetForImageClassification(config)


def flops_per_sample(model: torch.nn.Module, image_size: int) -> float:
    """Training FLOPs of one sample: what torch's FlopCounterMode counts (convolutions and matmuls, forward and
    backward) over one forward + backward of one image. Eval mode: a batch of one has no batch statistics, and
    the running ones stay untouched; the convolutions cost the same."""
    from torch.utils.flop_counter import FlopCounterMode

    training = model.training
    model.eval()
    with FlopCounterMode(display=False) as counter:
        model(pixel_values=torch.zeros(1, 3, image_size, image_size)).logits.sum().backward()
    model.zero_grad(set_to_none=True)
    model.train(training)
    return float(counter.get_total_flops())


def job_matmul_rate(precision: str, threads: int, local_ranks: int, sum_over_ranks: Callable[[list], list]) -> float:
    """Collective: the job's matmul FLOP/s in `precision`, every rank's measured (cached) rate summed, as
    corecpu's train.py divides by for its MFU."""
    from corecpu.compute import flops
    from corecpu.cpu.hardware import read_cpu_features

    key = flops.cache_key(read_cpu_features().model_name, precision, threads, local_ranks)
    return sum_over_ranks([flops.rank_matmul_rate(precision, key)[0]])[0]


def count_correct(model: torch.nn.Module, dataset: SyntheticImages, rank: int, world: int, batch_size: int,
                  prepare: Callable[[torch.Tensor], torch.Tensor]) -> tuple[int, int]:
    """(correct, examples) on this rank's strided share of `dataset`: summed over ranks, each example counts once.
    Call in eval mode under no_grad, with the plain (not DDP) model: shares differ in length by one."""
    correct, mine = 0, list(range(rank, len(dataset), world))
    for start in range(0, len(mine), batch_size):
        items = [dataset[i] for i in mine[start: start + batch_size]]
        x, y = prepare(torch.stack([x for x, _ in items])), torch.tensor([y for _, y in items])
        correct += int((model(pixel_values=x).logits.argmax(-1) == y).sum())
    return correct, len(mine)


def samples_per_s(ends: Sequence[float], samples: Sequence[int], warmup: int) -> float | None:
    """Global samples/s over steps warmup+1..S from each step's end time; None when no step is left to time."""
    if warmup < 1 or len(ends) <= warmup:
        return None
    return sum(samples[warmup:]) / max(ends[-1] - ends[warmup - 1], 1e-9)


def summary(rate: float | None, flops: float, matmul: float, **facts: object) -> str:
    """The run's last JSON line; MFU = FLOPs per sample x samples/s / the job's matmul rate."""
    mfu = rate * flops / matmul if rate and matmul > 0 else None
    return json.dumps({"summary": True, "samples_per_s": rate and round(rate, 3), "mfu": mfu and round(mfu, 4),
                       "flops_per_sample": flops, "matmul_flops": matmul, "ld_preload": os.environ.get("LD_PRELOAD"),
                       **facts})


# ---------------------------------------------------------------- training

def job_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The job's flags, which benchmarks/plain_image.py takes too: the same job by construction."""
    p.add_argument("--model", default="resnet50", choices=("resnet50", "tiny"))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=16, help="images per rank per step")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=500, help="held-out images")
    # 0.05 and 0.0125 (torchvision's 0.1 scaled to batch 32) sent ResNet-50's loss from 2.3 to 20-100 within
    # 12 steps at batch 16 without a warm-up; 0.002 stayed near 2.3-3.
    p.add_argument("--lr", type=float, default=0.002, help="SGD, momentum 0.9, weight decay 1e-4")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of samples/s")
    return p


def main() -> None:
    p = job_arguments(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    p.add_argument("--channels-last", default="auto", choices=("auto", "on", "off"),
                   help="auto: on (oneDNN's CPU convolutions work in NHWC; image_throughput.py measures both)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--compile", action="store_true", help="torch.compile the model (through corecpu.setup)")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--out", default="runs/image_classification")
    p.add_argument("--save-every", type=int, default=0, help="0: only at the last step")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()
    channels_last = args.channels_last != "off"
    layout = torch.channels_last if channels_last else torch.contiguous_format

    train = SyntheticImages(TRAIN_SIZE, args.num_classes, args.image_size, split="train")
    held_out = SyntheticImages(args.eval_size, args.num_classes, args.image_size, split="eval")

    with corecpu.setup(precision=args.precision, compile=args.compile) as run:
        torch.manual_seed(0)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
        model = build_model(args.model, args.num_classes)
        flops = flops_per_sample(model, args.image_size)
        model = model.to(memory_format=layout)  # weights in the layout the inputs come in
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        loader = run.loader(train, batch_size=args.batch_size, seed=0)
        ckpt = corecpu.Checkpoints(args.out, every=args.save_every, resume="auto" if args.resume else "")
        model, optimizer = run.wrap(model, optimizer, loader=loader, checkpoint=ckpt)  # precision, resume, DDP
        matmul = job_matmul_rate(run.precision.name, run.threads, run.launch.local_world_size, run.all_reduce_sum)
        run.print0(run.banner()[0])
        run.print0(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
                   f"{flops / 1e9:.2f} GFLOPs per trained {args.image_size}px image, channels_last {channels_last}")

        steps = run.steps(loader, max_steps=args.steps)  # epochs, the resume position, stop signals
        start, ends, samples = time.perf_counter(), [], []
        for step in steps:
            for x, y in step.micro_batches():
                loss = model(pixel_values=x.contiguous(memory_format=layout), labels=y).loss
                step.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
            samples.append(len(y) * run.world_size)  # every rank's batches are equal (the sampler pads)
            if step.number % args.log_every == 0 or step.is_last:  # one collective per logged step
                mean_loss = run.all_reduce_sum([loss.item()])[0] / run.world_size
                run.print0(json.dumps({"step": step.number, "loss": round(mean_loss, 6), "samples": samples[-1],
                                       "elapsed": round(ends[-1] - start, 4)}))
            ckpt.save(step)  # every --save-every steps and the last one

        with run.evaluating(model):  # eval mode: batch norm uses its running statistics
            correct, seen = run.all_reduce_sum(count_correct(
                corecpu.unwrap(model), held_out, run.rank, run.world_size, args.batch_size,
                lambda x: x.contiguous(memory_format=layout)))
        run.print0(summary(samples_per_s(ends, samples, args.warmup), flops, matmul, steps=steps.completed,
                           warmup=args.warmup, eval_accuracy=round(correct / max(seen, 1), 4), eval_examples=int(seen),
                           precision=run.precision.name, channels_last=channels_last, compile=args.compile,
                           ranks=run.world_size, threads=run.threads))


if __name__ == "__main__":
    main()
