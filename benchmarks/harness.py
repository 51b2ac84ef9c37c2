"""Pure planning for benchmarks/throughput.py: which variants, which commands, which data split.

Nothing here starts a process or reads a file, so the command lines can be checked in tests.
"""

from __future__ import annotations

import os

import random
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
DEFAULT_VARIANTS = ("corecpu", "trainer_tuned", "trainer_ddp", "trainer_1proc")
# corecpu_1rank: one rank alone on one rank's share of the cores, same per-rank batch: the compute-only step
# that distribution overhead is measured against. corecpu@COMMIT (--reference): an earlier corecpu, same flags.
ONE_RANK = "corecpu_1rank"
# corecpu_auto: `launch.sh auto --global-batch-size ranks x batch`: corecpu picks the ranks per node by measuring.
AUTO = "corecpu_auto"
# trainer_1proc_tuned: one process, every core as threads, the whole global batch, length-grouped, at the tuned
# precision: the tuned Trainer where one process beats torchrun's ranks (a careful user tries both).
ONE_PROC_TUNED = "trainer_1proc_tuned"
KNOWN_VARIANTS = (*DEFAULT_VARIANTS, "trainer_ddp_grouped", "plain_ddp", ONE_RANK, AUTO, ONE_PROC_TUNED)
# What a user who tunes the Trainer runs: torchrun, group_by_length, and whichever of fp32 and bf16 trains faster
# on the CPU at hand (BenchConfig.tuned_precision: throughput.py times both with tuned_precision.py).
TUNED = "trainer_tuned"
TORCHRUN_VARIANTS = ("trainer_ddp", "trainer_ddp_grouped", TUNED, "plain_ddp")
MODEL_SPECS = {"minilm": "default", "tiny": "tiny"}  # our name -> corecpu's --model value (else a path)
DATA_SUFFIXES = (".tsv", ".csv", ".jsonl")


@dataclass(frozen=True)
class BenchConfig:
    """Everything held equal across variants (the harness's flags, resolved)."""
    model: str = "minilm"
    data: str = "paraphrase"           # a built-in name, or the materialized train file (see plan_data)
    eval_data: str = "auto"            # auto for a built-in, else the materialized eval file
    columns: dict[str, str] = field(default_factory=dict)  # text_column/text_pair_column/label_column for files
    ranks: int = 2
    batch_size: int = 16               # per rank; the Trainer's one process gets ranks x this
    max_seq_len: int = 128
    epochs: int = 1
    max_steps: int = 0
    seed: int = 0
    precision: str = "auto"            # what the user asked for
    tuned_precision: str = "bf16"      # the tuned Trainers': the faster one, which throughput.py measures
    corecpu_extra: dict[str, str] = field(default_factory=dict)  # variant suffix -> extra train.py args
    one_rank_cpus: str = ""            # corecpu_1rank's CPUs (one rank's share), e.g. "0" or "0-3"
    reference: str = ""                # corecpu@REF: the commit's short name
    reference_tree: str = ""           # where that commit's files were exported
    reference_cache: str = ""          # its own cache directory: another version's cache entries are not ours

    @property
    def model_spec(self) -> str:
        return MODEL_SPECS.get(self.model, self.model)


def is_file_spec(spec: str) -> bool:
    """A data argument is a file when it has a data-file extension; otherwise a built-in name."""
    return Path(spec).suffix.lower() in DATA_SUFFIXES


def parse_corecpu_args(items: list[str]) -> dict[str, str]:
    """['nogroup=--no-group-by-length', ...] -> {'nogroup': '--no-group-by-length'} (variant corecpu:nogroup)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, extra = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--corecpu-args takes NAME='train.py flags' (NAME a word, e.g. nogroup), got {item!r}")
        out[name] = extra
    return out


def extra_args(spec: str) -> tuple[dict[str, str], list[str]]:
    """'I_MPI_WAIT_MODE=1 --allreduce gloo' -> ({'I_MPI_WAIT_MODE': '1'}, ['--allreduce', 'gloo']): leading
    NAME=VALUE words are the variant's environment, as in a shell command line."""
    words = shlex.split(spec)
    env: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def variant_order(requested: list[str], corecpu_extra: dict[str, str], reference: str = "") -> list[str]:
    """Run order in every round: corecpu first (its run resolves the precision), then its extra
    variants, then corecpu@REFERENCE, then the rest in the order given."""
    unknown = [v for v in requested if v not in KNOWN_VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {', '.join(KNOWN_VARIANTS)}")
    extra = [f"corecpu:{name}" for name in corecpu_extra] + ([reference_variant(reference)] if reference else [])
    first = ["corecpu"] if "corecpu" in requested else []
    return first + extra + [v for v in requested if v != "corecpu"]


def reference_variant(reference: str) -> str:
    return f"corecpu@{reference}"


def rank_shares(cores: list[tuple[int, ...]], ranks: int) -> list[str]:
    """Each rank's share of this host's cores (len(cores) // ranks of them in a row, every CPU of each), as CPU
    lists; with fewer cores than ranks the first rank still gets one."""
    per = max(1, len(cores) // ranks)
    return [",".join(str(c) for core in cores[r * per:(r + 1) * per] for c in core) for r in range(ranks)]


def one_rank_cpus(cores: list[tuple[int, ...]], ranks: int) -> str:
    """One rank's share of this host's cores, as a CPU list (rank_shares' first)."""
    return rank_shares(cores, ranks)[0]


def holdout_split(n: int, fraction: float = 0.1, seed: int = 0) -> tuple[list[int], list[int]]:
    """Deterministic (train, eval) index lists: a seeded permutation, the first round(n*fraction) held out."""
    if n < 2:
        raise ValueError(f"need at least 2 examples to hold some out for evaluation, got {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(max(1, round(n * fraction)), n - 1)
    return sorted(order[k:]), sorted(order[:k])


def _non_default(cfg: BenchConfig) -> list[str]:
    """train.py flags for the held-equal settings that differ from corecpu's own defaults:
    corecpu runs with its defaults, so equal values are not passed at all."""
    from corecpu.tasks.registry import parse_config

    d = parse_config([])  # train.py's defaults (classification)
    args: list[str] = []
    for flag, value, default in (("--batch-size", cfg.batch_size, d.batch_size),
                                 ("--max-seq-len", cfg.max_seq_len, d.max_seq_len), ("--seed", cfg.seed, d.seed)):
        if value != default:
            args += [flag, str(value)]
    return args


def _data_args(cfg: BenchConfig) -> list[str]:
    args = ["--data", cfg.data]
    if cfg.eval_data != "auto":
        args += ["--eval-data", cfg.eval_data]
    for key, value in cfg.columns.items():
        args += ["--" + key.replace("_", "-"), value]
    return args


def corecpu_launch(python: str = sys.executable, tree: Path = ROOT) -> list[str]:
    """launch.sh's last line (`exec python -m corecpu.launch --default-script train.py N ...`) with `python`: the
    same launch without launch.sh's install check, so it also runs where the environment came preinstalled and
    nothing can be fetched (issue 29's air-gapped node). The rank count and the script follow."""
    return [python, "-m", "corecpu.launch", "--default-script", str(tree / "train.py")]


def tuned_precision(requested: str, variants: list[str], model_spec: str, threads: int, batch_size: int,
                    env: dict[str, str], timeout: float, seq_len: int = 64) -> dict[str, Any]:
    """The tuned Trainers' precision and how it was chosen (the result JSON's record): as `requested`
    (--tuned-precision fp32|bf16), unused where no tuned variant runs, else timed (time_tuned_precision)."""
    if requested != "auto":
        return {"precision": requested, "by": "--tuned-precision"}
    if not {TUNED, ONE_PROC_TUNED} & set(variants):
        return {"precision": "bf16", "by": "no tuned Trainer variant ran"}
    found = time_tuned_precision(model_spec, threads, batch_size, env, timeout, seq_len)
    print(f"tuned Trainer precision: {found['precision']} (bf16 measured {found['bf16_speedup']:.2f}x fp32 at "
          f"{found['threads']} thread(s), {found['shapes']})", flush=True)
    return found


def time_tuned_precision(model_spec: str, threads: int, batch_size: int, env: dict[str, str], timeout: float,
                         seq_len: int = 64, python: str = sys.executable) -> dict[str, Any]:
    """The tuned Trainer's precision, timed by tuned_precision.py in a child process (torch stays out of the
    harness): its JSON line, with "by". A failed timing ends the benchmark with a line naming the fix."""
    import json
    import subprocess

    cmd = [python, str(BENCH / "tuned_precision.py"), "--model", model_spec, "--threads", str(threads),
           "--batch-size", str(batch_size), "--seq-len", str(seq_len)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"timing the tuned Trainer's precision failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}\n"
                         "pass --tuned-precision fp32 or bf16 to choose it yourself")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "by": "tuned_precision.py"}


def command(variant: str, cfg: BenchConfig, precision: str | None, run_dir: Path,
            python: str = sys.executable) -> list[str]:
    """The command line of one run. `precision` None lets corecpu resolve it (--precision auto);
    the baselines always get the resolved value."""
    length = ["--epochs", str(cfg.epochs)] + (["--max-steps", str(cfg.max_steps)] if cfg.max_steps else [])
    if variant.startswith("corecpu"):
        suffix = variant.partition(":")[2]
        extra = extra_args(cfg.corecpu_extra[suffix])[1] if suffix else []
        train = ["--model", cfg.model_spec, *_data_args(cfg), *length, *_non_default(cfg),
                 *(["--precision", precision] if precision else []),
                 "--output-dir", str(run_dir / output_name(variant)), "--log-every", "1", "--progress", "off", *extra]
        tree = Path(cfg.reference_tree) if variant.startswith("corecpu@") else ROOT  # an earlier commit: its own
        launch = corecpu_launch(python, tree)
        if variant == ONE_RANK:  # the user's own narrowing, which corecpu's launcher passes on to the rank
            return ["taskset", "-c", cfg.one_rank_cpus, *launch, "1", *train]
        if variant == AUTO:  # the per-rank batch follows the rank count auto picks; the global batch is held
            at = train.index("--batch-size") if "--batch-size" in train else None
            held = train[:at] + train[at + 2:] if at is not None else train
            return [*launch, "auto", "--global-batch-size", str(cfg.batch_size * cfg.ranks), *held]
        return [*launch, str(cfg.ranks), *train]
    if precision is None:
        raise ValueError(f"{variant} needs a resolved precision (fp32 or bf16)")
    out = run_dir / f"{variant}.json"
    base = ["--model", cfg.model_spec, *_data_args(cfg), *length, "--max-seq-len", str(cfg.max_seq_len),
            "--seed", str(cfg.seed), "--precision", precision, "--out-json", str(out)]
    torchrun = [str(Path(python).parent / "torchrun"), "--standalone", "--nproc-per-node", str(cfg.ranks)]
    if variant in (TUNED, ONE_PROC_TUNED):
        base[base.index("--precision") + 1] = cfg.tuned_precision
    if variant in ("trainer_ddp", "trainer_ddp_grouped", TUNED):
        grouped = "--no-group-by-length" if variant == "trainer_ddp" else "--group-by-length"
        return [*torchrun, str(BENCH / "hf_trainer.py"), *base, "--batch-size", str(cfg.batch_size), grouped]
    if variant in ("trainer_1proc", ONE_PROC_TUNED):
        return [python, str(BENCH / "hf_trainer.py"), *base, "--batch-size", str(cfg.batch_size * cfg.ranks),
                "--group-by-length" if variant == ONE_PROC_TUNED else "--no-group-by-length"]
    if variant == "plain_ddp":
        return [*torchrun, str(BENCH / "plain_ddp.py"), *base, "--batch-size", str(cfg.batch_size)]
    raise ValueError(f"unknown variant {variant!r}")


def output_name(variant: str) -> str:
    """A corecpu variant's output directory (and log) name under the repeat's run directory."""
    return variant.replace(":", "-").replace("@", "-at-")


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KMP_AFFINITY")


def variant_env(variant: str, env: dict[str, str], torchrun_threads: int,
                cfg: BenchConfig | None = None) -> dict[str, str]:
    """The environment of one run: no thread settings of ours, except OMP_NUM_THREADS for the ranks
    torchrun starts. torchrun's own default is 1 thread per rank, which on a many-core host would
    leave the baseline's cores idle; the fair share is the cores one process would use / ranks.
    A corecpu:NAME variant adds the NAME=VALUE words its --corecpu-args begin with."""
    clean = {k: v for k, v in env.items() if k not in THREAD_VARS}
    suffix = variant.partition(":")[2] if variant.startswith("corecpu:") else ""
    if cfg is not None and suffix:
        clean.update(extra_args(cfg.corecpu_extra[suffix])[0])
    if variant in TORCHRUN_VARIANTS:
        clean["OMP_NUM_THREADS"] = str(torchrun_threads)
    if cfg is not None and variant.startswith("corecpu@"):
        from corecpu import envvars

        clean["PYTHONPATH"] = cfg.reference_tree  # its corecpu package, ahead of the installed one
        clean[envvars.CACHE_DIR] = cfg.reference_cache
    elif variant.startswith("corecpu"):  # this checkout's corecpu, installed or not
        clean["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return clean


def corecpu_records(metrics_lines: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """corecpu's metrics.jsonl (run with --log-every 1) -> (step records, eval records)."""
    import json

    steps, evals = [], []
    for line in metrics_lines:
        rec = json.loads(line)
        if "eval_accuracy" in rec or "eval_exact_match" in rec:  # classification or QA
            evals.append({k: v for k, v in rec.items() if k == "step" or k.startswith("eval_")})
        elif "elapsed_s" in rec:
            if "samples" not in rec:
                raise ValueError("corecpu's metrics.jsonl has no per-step 'samples' count; this benchmark needs "
                                 "train.py to log the global samples of each step")
            tokens = {}
            if "tokens" in rec:
                tokens["tokens"] = rec["tokens"]
            elif "tokens_per_s" in rec:  # earlier versions logged only the rate over the step (--log-every 1)
                tokens["tokens"] = rec["tokens_per_s"] * (rec["elapsed_s"] - (steps[-1]["t"] if steps else 0.0))
            steps.append({"step": rec["step"], "t": rec["elapsed_s"], "loss": rec["loss"], "samples": rec["samples"],
                          **tokens, **({"padding": rec["padding"]} if "padding" in rec else {})})
    return steps, evals


def results_name(data_label: str, precision: str, ranks: int, model: str) -> str:
    suffix = "" if model == "minilm" else f"-{Path(model).name}"
    return f"throughput-{data_label}-{precision}-n{ranks}{suffix}"
