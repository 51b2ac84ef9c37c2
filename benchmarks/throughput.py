"""Training throughput and accuracy of corecpu vs Hugging Face Trainer (DDP and one process), on CPU.

    python benchmarks/throughput.py                                   # MiniLM, --data paraphrase, 1 epoch, 3 repeats
    python benchmarks/throughput.py --data mine.tsv --text-column 0 --label-column 1
    python benchmarks/throughput.py --model tiny --data builtin --max-steps 20 --repeats 1   # smoke test
    python benchmarks/throughput.py --corecpu-args 'nogroup=--no-group-by-length'           # + corecpu:nogroup
    python benchmarks/throughput.py --variants corecpu --corecpu-args 'ccl=--backend ccl' \
        --corecpu-args 'gloo=--backend gloo'    # oneCCL (after corecpu build-ccl) beside gloo + the MPI hook
    python benchmarks/throughput.py --background-load 1 --corecpu-args 'wait=I_MPI_WAIT_MODE=1'  # env, then flags
    python benchmarks/throughput.py --report benchmarks/results/X.json --markdown          # re-print only

Variants (same model and init, data, global batch, lr, schedule, clipping, max length,
seed, precision, epochs):
  corecpu              ./launch.sh N train.py, corecpu's defaults (precision auto as it resolves it)
  trainer_tuned        torchrun --nproc-per-node N hf_trainer.py, group_by_length, and the faster of fp32
                       and bf16 here (--tuned-precision): the Trainer as a user tunes it (the anchor)
  trainer_ddp          the same with random sampling at corecpu's precision (the Trainer's default)
  trainer_ddp_grouped  (on request) trainer_ddp with group_by_length
  trainer_1proc        python hf_trainer.py, one process, batch N x B, all cores as threads
  plain_ddp            (on request) the PyTorch CPU DDP tutorial loop under torchrun
  corecpu_1rank        (on request) one corecpu rank alone on one rank's share of the cores (taskset), same
                       per-rank batch, corecpu's precision: the compute-only reference for distribution overhead
  corecpu@COMMIT       (--reference COMMIT) that commit's corecpu with its defaults, for tokens/s against it
  corecpu_auto         (on request) ./launch.sh auto --global-batch-size N x B: corecpu picks the ranks per
                       node by measuring (its first run pays the trials; later ones read them back)
  trainer_1proc_tuned  (on request) trainer_1proc length-grouped at the tuned precision: the tuned Trainer as
                       one process
Each run trains, evaluates after every epoch and after its last step, and records rank 0's
wall clock at the end of every optimizer step. Throughput = counted global samples of steps
W+1..S / their time, without intervals holding an evaluation. Variants run interleaved
(a b c d, a b c d, ...); tables show medians and ratios against trainer_tuned. --background-load N
keeps N spinning processes running through every run. See README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import harness
import stats
from common import bert_base_random
from background import background_load
from harness import BenchConfig

console = Console(highlight=False)
if not console.is_terminal:
    console.width = 160  # logs and pipes: keep table rows on one line


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="minilm", help="minilm (all-MiniLM-L6-v2), bert-base (BERT-base's shape, "
                   "random init, MiniLM's vocabulary: for machines that fetch no weights), tiny, or a model directory")
    p.add_argument("--bert-vocab", type=Path, default=None, metavar="DIR", help="--model bert-base's tokenizer "
                   "(default: the default model's, all-MiniLM-L6-v2)")
    p.add_argument("--data", default="paraphrase", help="a built-in data set (paraphrase, builtin) or a "
                   ".tsv/.csv/.jsonl file")
    p.add_argument("--eval-data", default=None, help="eval file for a --data file (default: a deterministic "
                   "held-out 10%% of it); built-ins use their own eval split")
    for col in ("text-column", "text-pair-column", "label-column"):
        p.add_argument(f"--{col}", default="", help="column of a --data file: header name or 0-based index")
    p.add_argument("--ranks", type=int, default=2, help="DDP ranks, all on this host")
    p.add_argument("--batch-size", type=int, default=16, help="examples per rank per step (global = ranks x this)")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1, help="full epochs per run; evaluation follows each")
    p.add_argument("--max-steps", type=int, default=0, help="stop each run after this many steps (quick runs)")
    p.add_argument("--warmup", type=int, default=10, help="first W optimizer steps left out of the throughput")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of all variants")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: what corecpu resolves in its first run, then passed to every other variant")
    p.add_argument("--tuned-precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="the tuned Trainers' precision; auto: the faster of the two for this model at their "
                        "threads, timed before the runs (tuned_precision.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default=",".join(harness.DEFAULT_VARIANTS),
                   help=f"comma list from {', '.join(harness.KNOWN_VARIANTS)}")
    p.add_argument("--corecpu-args", action="append", default=[], metavar="NAME=ARGS",
                   help="extra variant corecpu:NAME = corecpu with these train.py flags (repeatable)")
    p.add_argument("--reference", default="", metavar="COMMIT",
                   help="add variant corecpu@COMMIT: that commit's train.py and corecpu (git archive), run the way "
                   "its launch.sh runs them, in this environment, with its own cache; reports corecpu's tokens/s over "
                   "its")
    p.add_argument("--torchrun-threads", type=int, default=0, help="OMP_NUM_THREADS for the ranks torchrun "
                   "starts (0: the threads torch uses in one process here / --ranks; 1: torchrun's own default)")
    p.add_argument("--out", type=Path, default=None, help="result JSON (default: benchmarks/results/"
                   "throughput-<data>-<precision>-n<N>[-<model>].json; the chart goes beside it as .png)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="run outputs and logs, kept (default: a temp dir, removed after a run that completes: each "
                        "variant's checkpoints and final model: 2-4 GB a benchmark)")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="start N busy processes (python -c 'while True: pass') for the whole comparison: a node "
                   "shared with a neighbour's job")
    p.add_argument("--timeout", type=float, default=7200, help="seconds allowed per run")
    p.add_argument("--report", type=Path, default=None, help="print the tables of an existing result JSON; run nothing")
    p.add_argument("--markdown", action="store_true", help="also print the summary as a Markdown table")
    args = p.parse_args()
    try:
        args.corecpu_extra = harness.parse_corecpu_args(args.corecpu_args)
        args.order = harness.variant_order([v for v in args.variants.split(",") if v], args.corecpu_extra,
                                           args.reference[:7])
    except ValueError as exc:
        p.error(str(exc))
    if args.warmup < 1:
        p.error("--warmup must be at least 1: the timed window starts at the end of step W")
    if not harness.is_file_spec(args.data) and (args.eval_data or any(
            getattr(args, c) for c in ("text_column", "text_pair_column", "label_column"))):
        p.error(f"--eval-data and the column flags apply to a --data file; {args.data!r} is a built-in with its own "
                "eval split")
    return args


# ---------------------------------------------------------------- data

def prepare_data(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Built-ins pass through by name. A file is read once with corecpu's loader (column flags
    applied) and written as train.jsonl / eval.jsonl, so every variant reads identical splits."""
    if not harness.is_file_spec(args.data):
        return {"data": args.data, "eval_data": "auto", "columns": {}}, {
            "data_label": args.data, "eval": f"the built-in's eval split ({args.data}, split='eval')"}
    from corecpu.data.files import load_file

    def col(v: str) -> str | int | None:
        return None if v == "" else int(v) if v.isdigit() else v

    columns = {k: col(getattr(args, k)) for k in ("text_column", "text_pair_column", "label_column")}
    train = load_file(args.data, **columns)
    if args.eval_data:
        evald = load_file(args.eval_data, label_names=train.label_names, **columns)
        note = f"the file {args.eval_data}"
        train_idx, eval_idx = list(range(len(train))), None
    else:
        train_idx, eval_idx = harness.holdout_split(len(train), 0.1, seed=0)
        evald, note = train, (f"a deterministic held-out 10% of {args.data} ({len(eval_idx)} examples, seeded "
                              f"permutation, seed 0); training uses the other {len(train_idx)}")
    keys = ("sentence1", "sentence2", "label") if train.text_pairs is not None else ("text", None, "label")
    files = {}
    for split, data, idx in (("train", train, train_idx), ("eval", evald, eval_idx)):
        path = work / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for i in idx if idx is not None else range(len(data)):
                row = {keys[0]: data.texts[i], keys[2]: data.label_names[data.labels[i]]}
                if keys[1]:
                    row[keys[1]] = data.text_pairs[i]  # type: ignore[index]
                fh.write(json.dumps(row) + "\n")
        files[split] = str(path)
    cols = {"text_column": keys[0], "label_column": keys[2], **({"text_pair_column": keys[1]} if keys[1] else {})}
    return {"data": files["train"], "eval_data": files["eval"], "columns": cols}, {
        "data_label": Path(args.data).stem, "source": str(Path(args.data).resolve()), "eval": note}


# ---------------------------------------------------------------- running

def machine() -> dict[str, Any]:
    from corecpu.cpu.hardware import read_cpu_features

    features = read_cpu_features()
    versions = {}
    for dist_name in ("torch", "transformers", "accelerate", "impi-rt", "corecpu"):
        try:
            versions[dist_name] = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            versions[dist_name] = None
    git = subprocess.run(["git", "-C", str(harness.ROOT), "describe", "--always", "--dirty"], capture_output=True,
                         text=True)
    flags = {f: f in features.flags for f in ("avx512_bf16", "amx_bf16")}
    return {"cpu_model": features.model_name, "cpu_flags": flags,
            "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions,
            "git": git.stdout.strip() or None,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run_logged(variant: str, cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> tuple[float, float]:
    """Run `cmd` from the repository, its output to `log`: (wall seconds, the load average before). A failure
    raises with the log's last lines."""
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=harness.ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise RuntimeError(f"{variant} exited with {proc.returncode}; last lines of {log}:\n{tail}")
    return wall, load_before


def export_reference(commit: str, work: Path) -> Path:
    """`commit`'s files, exported from this repository's history into `work` (as tests/e2e/test_loss_equivalence)."""
    rev = subprocess.run(["git", "-C", str(harness.ROOT), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode:
        raise SystemExit(f"throughput.py: error: --reference {commit} is not a commit of this repository "
                         "(a shallow clone lacks history: git fetch --unshallow)")
    tree = work / f"reference-{rev.stdout.strip()[:12]}"
    tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(harness.ROOT), "archive", rev.stdout.strip()], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def allowed_cores() -> list[tuple[int, ...]]:
    """This host's cores, each as the CPUs of it this process may use; cores with none left out."""
    from corecpu.cpu.topology import read_topology

    topology = read_topology()
    allowed = set(topology.allowed)
    return [cpus for cpus in (tuple(c for c in core.cpus if c in allowed) for core in topology.cores) if cpus]


def one_rank_share(ranks: int) -> str:
    return harness.one_rank_cpus(allowed_cores(), ranks)


def paired(raw: list[dict[str, Any]], variant: str, reference: str, key: str, scale: float = 1.0) -> dict[str, Any]:
    """variant's `key` over `reference`'s (times `scale`), repeat by repeat (each repeat's own pair), and the median."""
    per = []
    for rep in sorted({r["repeat"] for r in raw}):
        a = next((r for r in raw if r["repeat"] == rep and r["variant"] == variant), None)
        b = next((r for r in raw if r["repeat"] == rep and r["variant"] == reference), None)
        if a and b and a.get(key) and b.get(key):
            per.append(a[key] / (b[key] * scale))
    return {"per_repeat": per, "median": statistics.median(per) if per else None}


def comparisons(raw: list[dict[str, Any]], order: list[str], ranks: int) -> dict[str, Any]:
    """Distribution overhead (corecpu against `ranks` x one rank alone) and the reference commit's tokens/s."""
    out: dict[str, Any] = {}
    if "corecpu" in order and harness.ONE_RANK in order:
        eff = paired(raw, "corecpu", harness.ONE_RANK, "samples_per_s", scale=ranks)
        out["distribution"] = {"efficiency": eff, "overhead_median": None if eff["median"] is None else
                               1 / eff["median"] - 1,
                               "method": f"overhead = {ranks} x corecpu_1rank samples/s / corecpu samples/s - 1: "
                                         "the N-rank step's time over the compute-only step of one rank alone on one "
                                         "rank's share of the cores, same per-rank batch and precision"}
    ref = next((v for v in order if v.startswith("corecpu@")), None)
    if "corecpu" in order and ref:
        out["reference"] = {"variant": ref, "tokens_per_s": paired(raw, "corecpu", ref, "tokens_per_s"),
                            "samples_per_s": paired(raw, "corecpu", ref, "samples_per_s"),
                            "wall_speedup": paired(raw, ref, "corecpu", "wall_s")}
    return out


def run_once(variant: str, cmd: list[str], run_dir: Path, args: argparse.Namespace,
             env: dict[str, str]) -> dict[str, Any]:
    log = run_dir / f"{harness.output_name(variant)}.log"
    wall, load_before = run_logged(variant, cmd, log, env, args.timeout)
    extra: dict[str, Any] = {}
    if variant.startswith("corecpu"):
        out = run_dir / harness.output_name(variant)
        steps, evals = harness.corecpu_records((out / "metrics.jsonl").read_text().splitlines())
        resolved = json.loads((out / "config.json").read_text()).get("resolved", {})
        if not resolved.get("precision"):
            raise RuntimeError(f"{out}/config.json does not record the resolved precision ('resolved': "
                               "{'precision': ...}); this benchmark needs it to run the others at corecpu's precision")
        extra["precision"] = resolved["precision"]
        extra["ranks"] = json.loads((out / "config.json").read_text()).get("decisions", {}).get("ranks")
        extra["binding"] = resolved.get("binding")
        summary = json.loads((out / "summary.json").read_text())
        extra["phases"] = summary.get("phases")  # start-up, steps, eval, save
        extra["mfu"] = summary.get("mfu_after_warmup")  # against the job's own measured matmul rate
        extra["matmul"] = summary.get("matmul")
    else:
        recorded = json.loads((run_dir / f"{variant}.json").read_text())
        steps, evals = recorded["steps"], recorded["evals"]
        extra = {k: recorded[k] for k in ("precision", "torch_threads", "omp_num_threads", "sampling", "optim")
                 if k in recorded}
        if "padded_len" in steps[0]:
            extra["mean_padded_len"] = sum(s["padded_len"] for s in steps) / len(steps)
    return {"variant": variant, **stats.run_result(steps, evals, args.warmup, wall), **extra,
            "load_avg_before": load_before, "log": str(log), "steps": steps, "evals": evals}


def print_tables(result: dict[str, Any], markdown: bool) -> None:
    raw = Table(title="every run", title_justify="left")
    for col in ("repeat", "variant", "precision", "samples/s", "ms/step", "wall s", "eval acc", "final loss", "load"):
        raw.add_column(col, justify="left" if col in ("variant", "precision") else "right")
    for r in result["raw"]:
        raw.add_row(str(r["repeat"]), r["variant"], r.get("precision", "-"), f"{r['samples_per_s']:.1f}",
                    f"{r['ms_per_step']:.0f}", f"{r['wall_s']:.1f}", f"{r['eval_accuracy']:.4f}",
                    f"{r['final_loss']:.4f}", f"{r['load_avg_before']:.1f}")
    console.print(raw)
    table = Table(title=stats.title(result), title_justify="left")
    for col in stats.headers(result.get("baseline")):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in stats.table_rows(result):
        table.add_row(*row)
    console.print(table)
    for name, block in result.get("comparisons", {}).items():
        if name == "distribution":
            eff = block["efficiency"]
            console.print(f"distribution overhead against {result['config']['ranks']} x one rank alone: "
                          f"{block['overhead_median']:+.1%} (efficiency per repeat "
                          f"{', '.join(f'{x:.3f}' for x in eff['per_repeat'])})")
        else:
            tps = block["tokens_per_s"]
            console.print(f"corecpu against {block['variant']}: tokens/s x{tps['median']:.2f} (per repeat "
                          f"{', '.join(f'{x:.2f}' for x in tps['per_repeat'])}), whole command "
                          f"x{block['wall_speedup']['median']:.2f}")
    if markdown:
        print("\n" + stats.markdown(result))


def run_rounds(args: argparse.Namespace, cfg: BenchConfig, work: Path, env: dict[str, str], torchrun_threads: int,
               precision: str | None, resolved_by: str | None, raw: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """Every variant once per round, rounds interleaved; appends to `raw`. Returns the precision used."""
    for rep in range(1, args.repeats + 1):
        run_dir = work / f"repeat{rep}"
        run_dir.mkdir(parents=True, exist_ok=True)
        for v in args.order:
            # corecpu and an earlier commit resolve `auto` themselves; the one-rank reference takes corecpu's.
            own = None if v.startswith("corecpu") and v != harness.ONE_RANK and args.precision == "auto" else precision
            cmd = harness.command(v, cfg, own, run_dir)
            result = run_once(v, cmd, run_dir, args, harness.variant_env(v, env, torchrun_threads, cfg))
            if precision is None:  # the first corecpu run decides for everyone
                precision, resolved_by = result["precision"], f"corecpu's --precision auto (repeat {rep} run)"
            raw.append({"repeat": rep, "command": cmd, **result})
            console.print(f"repeat {rep}/{args.repeats} {v:<20} {result['samples_per_s']:7.1f} samples/s  "
                          f"{result['ms_per_step']:6.0f} ms/step  wall {result['wall_s']:6.1f}s  eval acc "
                          f"{result['eval_accuracy']:.4f}  final loss {result['final_loss']:.4f}  "
                          f"({result.get('precision')})")
    return precision, resolved_by


def main() -> None:
    args = parse_args()
    if args.report:
        result = json.loads(args.report.read_text())
        if "ratios" not in result:
            raise SystemExit(f"{args.report} was written by the earlier fixed-step harness (no evaluation, no "
                             "ratios against trainer_ddp); its numbers are in README.md; re-run to get a new one")
        print_tables(result, args.markdown)
        return
    if any(v.startswith("trainer_") for v in args.order) and importlib.util.find_spec("accelerate") is None:
        raise SystemExit("throughput.py: error: the Trainer variants need accelerate, which this Python lacks; "
                         "pip install -e '.[bench]' (or drop them with --variants corecpu)")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corecpu-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    data_cfg, data_info = prepare_data(args, work)
    tree = export_reference(args.reference, work) if args.reference else None
    model = str(bert_base_random(work, args.bert_vocab)) if args.model == "bert-base" else args.model
    cfg = BenchConfig(model=model, **data_cfg, ranks=args.ranks, batch_size=args.batch_size,
                      max_seq_len=args.max_seq_len, epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
                      precision=args.precision, corecpu_extra=args.corecpu_extra,
                      one_rank_cpus=one_rank_share(args.ranks) if harness.ONE_RANK in args.order else "",
                      reference=args.reference[:7], reference_tree=str(tree or ""),
                      reference_cache=str(work / "reference-cache") if tree else "")
    # corecpu resolves `auto` in its own first run; without a corecpu variant, use its static rule.
    precision: str | None = None if args.precision == "auto" else args.precision
    resolved_by = "requested" if precision else None
    if precision is None and "corecpu" not in args.order:
        from corecpu.compute.precision import decide_precision
        from corecpu.cpu.hardware import read_cpu_features

        precision = decide_precision("auto", read_cpu_features()).name  # unmeasured: bf16 only on AMX
        resolved_by = "corecpu.compute.precision.decide_precision (no corecpu variant ran)"
    # launch.sh binds and sizes corecpu's ranks, one process uses torch's default (all cores), and
    # torchrun's ranks get an equal share of those (see harness.variant_env).
    env = {k: v for k, v in os.environ.items() if k not in harness.THREAD_VARS}
    one_process = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                     env=env, capture_output=True, text=True, check=True).stdout)
    torchrun_threads = args.torchrun_threads or max(1, one_process // args.ranks)
    tuned = harness.tuned_precision(args.tuned_precision, args.order, cfg.model_spec, torchrun_threads, cfg.batch_size,
                                    env, args.timeout)
    cfg = dataclasses.replace(cfg, tuned_precision=tuned["precision"])
    console.print(f"[bold]throughput benchmark[/] variants {args.order}; data {data_info}\n"
                  f"logs and run outputs: {work}")
    raw: list[dict[str, Any]] = []
    with background_load(args.background_load):
        precision, resolved_by = run_rounds(args, cfg, work, env, torchrun_threads, precision, resolved_by, raw)
    mismatched = sorted({r["variant"] for r in raw if r.get("precision") not in (None, precision)
                         and r["variant"] not in (harness.TUNED, harness.ONE_PROC_TUNED)})
    config = {"model": args.model, "data": data_info["data_label"], "data_info": data_info,
              "ranks": args.ranks, "batch_size": args.batch_size, "global_batch": args.batch_size * args.ranks,
              "max_seq_len": args.max_seq_len, "epochs": args.epochs, "max_steps": args.max_steps,
              "warmup": args.warmup, "repeats": args.repeats, "precision": precision,
              "precision_requested": args.precision, "precision_resolved_by": resolved_by,
              "precision_mismatch": mismatched, "seed": args.seed, "variants": args.order,
              "corecpu_extra": args.corecpu_extra, "one_process_threads": one_process,
              "one_rank_cpus": cfg.one_rank_cpus, "reference": args.reference or None,
              "torchrun_omp_num_threads": torchrun_threads, "background_load": args.background_load,
              "tuned_precision": tuned}
    result = {"config": config, "machine": machine(), **stats.summarize(raw, args.order),
              "comparisons": comparisons(raw, args.order, args.ranks), "raw": raw,
              "method": "samples_per_s = counted global samples of steps W+1..S / their summed step intervals "
                        "(t = rank 0 wall clock at the end of each optimizer step; intervals holding an "
                        "evaluation left out); wall_s = whole launch command incl. start-up, evaluation, saving"}
    out = args.out or harness.BENCH / "results" / (harness.results_name(
        data_info["data_label"], precision, args.ranks, args.model) + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_tables(result, args.markdown)
    try:
        from chart import bar_chart  # needs matplotlib, which only the bench and report extras install
    except ModuleNotFoundError as exc:
        console.print(f"written to {out}; no chart ({exc.name} is not installed: pip install -e '.[bench]')")
    else:
        console.print(f"written to {out} and {bar_chart(result, out.with_suffix('.png'))}")
    if args.work_dir is None:  # everything read from it is in the JSON; a failed run raised above and keeps it
        shutil.rmtree(work, ignore_errors=True)
        console.print(f"removed {work} (run outputs and logs); --work-dir DIR keeps them")
    if mismatched:
        console.print(f"[yellow]warning:[/] {mismatched} ran at a precision other than {precision}")


if __name__ == "__main__":
    main()
