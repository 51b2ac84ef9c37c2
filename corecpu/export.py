"""The `corecpu export` subcommand's command line (corecpu.cli lists it). Torch-free, so that `corecpu`
starts fast; the export itself is corecpu.checkpoint_export, imported when it runs."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint's model as a directory from_pretrained loads (no process group)",
        description="Rebuild a run's model as train.py built it, load a checkpoint's weights (bit for bit) and write "
        "it as final/ is written: config.json, model.safetensors (a LoRA run: the adapter in PEFT's format), the "
        "tokenizer, README.md and checkpoint.json. One process, no process group, no launcher.",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoints/step-* directory, or a run's --output-dir (then --step picks one)")
    p.add_argument("dest", metavar="DIR", help="directory to write (must not exist, or be empty)")
    p.add_argument("--step", metavar="N|latest|best", default=None,
                   help="with a run directory: a step number, latest (default) or best (the --keep-best checkpoint)")
    p.add_argument("--model", metavar="PATH", default=None,
                   help="the base model to rebuild on (default: the run's --model, where the run found it)")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    # torch and transformers load only when an export runs: every other subcommand starts without them.
    from corecpu.checkpoint_export import export_checkpoint

    path, meta = export_checkpoint(args.checkpoint, args.dest, step=args.step, model=args.model)
    print(f"exported step {meta.get('step')} ({path}) to {args.dest}")
    return 0
