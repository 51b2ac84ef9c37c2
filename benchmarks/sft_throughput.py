"""corecpu's --task causal-lm against TRL's SFTTrainer, the tool causal-LM users run instead: the same model,
data, LoRA settings, per-rank batch, lr schedule, steps and seed; interleaved repeats; medians.

    python benchmarks/sft_throughput.py --model llama-135m --steps 16 --repeats 2 \\
        --out benchmarks/results/sft-135m.json

Variants, each 2 ranks on the one host:
  corecpu       ./launch.sh 2 --task causal-lm ...  (packing, precision measured at start-up, its binding)
  trl_tuned     torchrun --nproc-per-node 2 benchmarks/trl_sft.py --form tuned: packing (padding-free),
                no gradient checkpointing, the precision corecpu measured faster here
  trl_defaults  the same with --form defaults: SFTConfig's own (bf16, gradient checkpointing, no packing)
and modes: full fine-tuning, LoRA (r 8, alpha 16, dropout 0.05, every linear layer of the blocks).

Held equal: the train file (the built-in SFT set's first --examples, as prompt/completion JSONL) and eval file
(its held-out split's first --eval-examples), --steps optimizer steps, lr (corecpu's defaults for the model:
1e-3 full from a random built-in, 2e-4 LoRA), warm-up 10% then linear decay, weight decay 0, clipping 1.0,
seed. Batches: 4 packed rows of --max-seq-len per rank for the packed variants; for trl_defaults, which pads
one example per row, the per-rank batch is 4 x the examples a packed row holds on average (from corecpu's
packing of the same file), so every variant trains about the same tokens per step.

Reported per variant and mode (medians over repeats): whole-command wall time (process start to exit, start-up,
tokenizing, evaluation and saving included), trained tokens per second of the training loop (non-pad tokens:
corecpu's records; TRL's own num_tokens over its train_runtime), the eval loss after the last step (mean
next-token loss over the eval file's completion tokens, fp32), and peak memory per node (the sum of the ranks'
peak RSS). Ratios are corecpu's against each baseline, wall time and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corecpu.data.builtin_sft import builtin_sft  # noqa: E402

VARIANTS = ("corecpu", "trl_tuned", "trl_defaults")
MODES = ("full", "lora")
ROWS_PER_RANK = 4


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-135m", help="a corecpu built-in causal model or a directory")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--examples", type=int, default=2000)
    p.add_argument("--eval-examples", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--defaults-repeats", type=int, default=0, help="repeats of trl_defaults (0: --repeats); it is "
                   "the slowest by far")
    p.add_argument("--defaults-time-limit", type=float, default=0,
                   help="stop a trl_defaults run after this many seconds and report a lower bound (0: no limit)")
    p.add_argument("--no-warm-up", action="store_true", help="skip the untimed 1-step first runs (caches warm)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def write_data(work: Path, examples: int, eval_examples: int) -> tuple[Path, Path]:
    def dump(path: Path, rows: list[tuple[str, ...]]) -> Path:
        path.write_text("".join(json.dumps({"prompt": r[0], "completion": r[1]}) + "\n" for r in rows))
        return path
    return (dump(work / "train.jsonl", builtin_sft("train", seed=0)[:examples]),
            dump(work / "eval.jsonl", builtin_sft("eval", seed=0)[:eval_examples]))


def examples_per_row(model_dir: Path, train: Path, max_seq_len: int) -> float:
    """How many examples corecpu packs into a row of this file, on average."""
    from transformers import AutoTokenizer

    from corecpu.data.causal_records import read_causal_data
    from corecpu.data.causal_tokens import tokenize_causal
    from corecpu.data.packing import pack_bins
    tok = tokenize_causal(read_causal_data(str(train), split="train"), AutoTokenizer.from_pretrained(model_dir),
                          max_seq_len)
    return len(tok) / len(pack_bins([len(ids) for ids in tok.input_ids], max_seq_len))


def lr_of(mode: str) -> str:
    return "2e-4" if mode == "lora" else "1e-3"  # corecpu's defaults (CausalLMOptions.lr_for, built-in model)


def command(variant: str, mode: str, a: argparse.Namespace, model_dir: Path, train: Path, held: Path, out: Path,
            defaults_batch: int, precision: str) -> tuple[list[str], dict[str, str]]:
    lora = ["--lora-r", "8", "--lora-alpha", "16", "--lora-dropout", "0.05"] if mode == "lora" else []
    common = ["--max-seq-len", str(a.max_seq_len), "--max-steps", str(a.steps), "--lr", lr_of(mode),
              "--weight-decay", "0", "--seed", "0", *lora]
    if variant == "corecpu":
        return [str(ROOT / "launch.sh"), "2", "--task", "causal-lm", "--model", a.model, "--data", str(train),
                "--eval-data", str(held), "--eval-generate", "0", "--batch-size", str(ROWS_PER_RANK),
                "--log-every", "1", "--progress", "off", "--output-dir", str(out), *common], {}
    form = variant.removeprefix("trl_")
    batch = ROWS_PER_RANK if form == "tuned" else defaults_batch
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2)), "TOKENIZERS_PARALLELISM": "false"}
    return [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node", "2",
            str(ROOT / "benchmarks" / "trl_sft.py"), "--model", str(model_dir), "--data", str(train),
            "--eval-data", str(held), "--form", form, "--batch-size", str(batch), "--precision", precision,
            "--out-json", str(out / "trl.json"), *common], env


def read_result(variant: str, out: Path, stdout: str) -> dict[str, Any]:
    if variant != "corecpu":
        r = json.loads((out / "trl.json").read_text())
        return {"tokens_per_s": r["tokens"] / r["train_seconds"], "eval_loss": r["eval_loss"],
                "peak_rss_mb_node": sum(r["peak_rss_mb"]), "losses": r["losses"], "tokens": r["tokens"],
                "train_seconds": r["train_seconds"], "phases": {"train_s": r["train_seconds"], "eval_s": r["eval_seconds"]}}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    summary = json.loads((out / "summary.json").read_text())
    tokens = sum(r["tokens"] for r in steps)
    precision = re.search(r"^precision (\w+)", stdout, re.M)
    return {"tokens_per_s": tokens / summary["phases"]["steps_s"], "eval_loss": evals[-1]["eval_loss"],
            "peak_rss_mb_node": sum(r["peak_rss_mb"] for r in summary["ranks"]), "losses": [r["loss"] for r in steps],
            "tokens": tokens, "train_seconds": summary["phases"]["steps_s"], "phases": summary["phases"],
            "precision": precision.group(1) if precision else None}


def descendants(root: int) -> list[int]:
    """Every process below `root`, read from /proc (children before their own children)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone while we looked
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def run_one(variant: str, mode: str, a: argparse.Namespace, work: Path, ctx: dict[str, Any]) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"{variant}-{mode}-", dir=work))
    cmd, env = command(variant, mode, a, ctx["model_dir"], ctx["train"], ctx["eval"], out, ctx["defaults_batch"],
                       ctx["precision"])
    limit = a.defaults_time_limit if variant == "trl_defaults" and a.defaults_time_limit > 0 else None
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *descendants(proc.pid)]:  # torchrun starts its workers in sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()
        print(f"{variant:13s} {mode:4s} stopped at the {limit:.0f} s limit: wall time at least that", flush=True)
        return {"variant": variant, "mode": mode, "timed_out": True, "wall_s_at_least": limit}
    wall = time.perf_counter() - start
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if done.returncode:
        sys.exit(f"{variant} {mode} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = {"variant": variant, "mode": mode, "wall_s": wall, **read_result(variant, out, done.stdout)}
    print(f"{variant:13s} {mode:4s} wall {wall:7.1f}s  {result['tokens_per_s']:8.0f} tokens/s  eval loss "
          f"{result['eval_loss']:.4f}  peak {result['peak_rss_mb_node']:7.0f} MB/node", flush=True)
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in runs}):
        rows = {}
        for variant in VARIANTS:
            mine = [r for r in runs if r["mode"] == mode and r["variant"] == variant and not r.get("timed_out")]
            stopped = [r for r in runs if r["mode"] == mode and r["variant"] == variant and r.get("timed_out")]
            if stopped and not mine:  # only a lower bound: no tokens/s, no eval loss
                rows[variant] = {"wall_s_at_least": min(r["wall_s_at_least"] for r in stopped), "repeats": 0}
            if mine:
                rows[variant] = {k: statistics.median(r[k] for r in mine)
                                 for k in ("wall_s", "tokens_per_s", "eval_loss", "peak_rss_mb_node")}
                rows[variant]["repeats"] = len(mine)
        if "corecpu" in rows:
            ours = rows["corecpu"]
            for name, theirs in rows.items():
                if name != "corecpu" and "wall_s_at_least" in theirs:
                    theirs["corecpu_wall_speedup_at_least"] = theirs["wall_s_at_least"] / ours["wall_s"]
                elif name != "corecpu":
                    theirs["corecpu_wall_speedup"] = theirs["wall_s"] / ours["wall_s"]
                    theirs["corecpu_tokens_speedup"] = ours["tokens_per_s"] / theirs["tokens_per_s"]
                    theirs["corecpu_eval_loss_ratio"] = ours["eval_loss"] / theirs["eval_loss"]
        table[mode] = rows
    return table


def main() -> None:
    a = parse_args()
    from corecpu.training.modeling import resolve_model_dir
    model_dir = resolve_model_dir(a.model)
    variants, modes = a.variants.split(","), a.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="sft-bench-") as tmp:
        work = Path(tmp)
        train, held = write_data(work, a.examples, a.eval_examples)
        per_row = examples_per_row(model_dir, train, a.max_seq_len)
        ctx = {"model_dir": model_dir, "train": train, "eval": held, "precision": "fp32",
               "defaults_batch": round(ROWS_PER_RANK * per_row)}
        print(f"{per_row:.2f} examples per packed row: trl_defaults takes {ctx['defaults_batch']} examples per rank "
              "per step", flush=True)
        # Untimed first runs (1 step): corecpu's caches (the precision and all-reduce measurements, the built-in
        # model) and the page cache (both tools' imports) are what a user's second run finds.
        cold = {}
        for mode in modes if not a.no_warm_up else ():
            for variant in (v for v in variants if v != "trl_defaults"):  # its imports are trl_tuned's
                one = argparse.Namespace(**{**vars(a), "steps": 1})
                cold[f"{variant}-{mode}"] = run_one(variant, mode, one, work, ctx)["wall_s"]
        runs: list[dict[str, Any]] = []
        for repeat in range(a.repeats):
            order = variants[repeat % len(variants):] + variants[:repeat % len(variants)]  # rotate: no fixed slot
            for mode in modes:
                for variant in order:
                    if variant == "trl_defaults" and a.defaults_repeats and repeat >= a.defaults_repeats:
                        continue
                    result = run_one(variant, mode, a, work, ctx)
                    if variant == "corecpu" and result.get("precision"):
                        ctx["precision"] = result["precision"]  # the tuned baseline takes corecpu's measurement
                    runs.append({**result, "repeat": repeat})
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "unknown")
        report = {"cpu": cpu, "cores": os.cpu_count(), "args": {k: str(v) for k, v in vars(a).items()},
                  "examples_per_row": per_row, "defaults_batch": ctx["defaults_batch"],
                  "tuned_precision": ctx["precision"], "untimed_first_runs_1_step_wall_s": cold, "table": summarize(runs), "runs": runs}
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1))
        print(json.dumps(report["table"], indent=1))


if __name__ == "__main__":
    main()
