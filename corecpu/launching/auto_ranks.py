"""`./launch.sh auto`: the ranks per node chosen by measuring this job on this machine, the global batch held.

More ranks are not always faster (issue 29's 16-core Xeon: 1, 2, 4 and 8 ranks trained at 106, 110, 109 and
86 samples/s), and which count wins depends on the model, the sequence length and the CPU. So `auto` measures:

- The candidates are the divisors of this node's usable cores up to half of them (1 and 2 on two cores) that
  split the global batch: `--global-batch-size G`, else twice the task's per-rank default (what `./launch.sh 2`
  trains with). Each rank count then gets `--batch-size G / (ranks x --grad-accum)`.
- Every run of 20 steps or more already records its samples/s per rank count under its job's shape
  (corecpu.reporting.rank_history). A candidate this machine has no record of trains TRIAL_STEPS steps of the
  same job into a temporary directory, without evaluation, and lands in that history like any run.
- The fastest median wins; a count within TIE of it with fewer ranks wins instead (less memory, a smaller
  all-reduce group, and the difference is noise). The choice and every rate go to the console and, through
  CORECPU_RANKS_DECISION, to the job's config.json. The next `auto` of the same job starts at once.

Only for train.py (the trials pass its flags) and one node (the trials run here).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from corecpu.cpu.hardware import read_cpu_features
from corecpu import cachefile, envvars
from corecpu.errors import CoreCPUError
from corecpu.reporting import rank_history

TRIAL_STEPS = 30
TRIAL_LOG_EVERY = 5  # the rate is timed after the first log interval: 25 of the 30 steps
TIE = 0.02
CORES_NOTE = "the divisors of this node's usable cores up to half of them"


@dataclass(frozen=True)
class RankChoice:
    ranks: int
    batch_size: int  # per rank
    global_batch: int
    rates: Mapping[int, float]  # samples/s per candidate that ran (medians of the recorded runs); read-only
    trialled: tuple[int, ...]  # the candidates measured by this launch (the rest came from the history)
    failed: Mapping[int, str]  # candidates whose trial failed, and the last line of its output; read-only

    def line(self) -> str:
        rates = ", ".join(f"{n}: {r:.1f}" for n, r in sorted(self.rates.items()))
        how = (f"{TRIAL_STEPS}-step trials of this job now ({', '.join(map(str, self.trialled))}), the rest from "
               "earlier runs" if self.trialled and len(self.trialled) < len(self.rates)
               else f"{TRIAL_STEPS}-step trials of this job now" if self.trialled else "earlier runs of this job")
        failed = "".join(f"; {n} failed ({why})" for n, why in sorted(self.failed.items()))
        return (f"auto: {self.ranks} rank(s) per node, --batch-size {self.batch_size} (global batch "
                f"{self.global_batch}); samples/s by ranks per node {rates} ({how} on this machine){failed}")


def candidates(cores: int, global_batch: int, grad_accum: int) -> list[int]:
    """Pure. Rank counts per node worth measuring: divisors of `cores` up to half of them (both, on 2) that split
    the global batch over ranks x grad_accum."""
    cap = cores if cores <= 2 else cores // 2
    return [n for n in range(1, cap + 1) if cores % n == 0 and global_batch % (n * grad_accum) == 0]


def pick(rates: Mapping[int, float]) -> int:
    """Pure. The fastest rank count, or a smaller one within TIE of it."""
    best = max(rates.values())
    return min(n for n, r in rates.items() if r >= best * (1 - TIE))


def trial_args(script_args: Sequence[str], batch: int, output_dir: str) -> list[str]:
    """The job's own flags, then what makes it a short, silent trial (train.py's parser: the last one wins)."""
    return [*script_args, "--batch-size", str(batch), "--max-steps", str(TRIAL_STEPS), "--log-every",
            str(TRIAL_LOG_EVERY), "--eval-data", "none", "--keep-best", "", "--save-every", "0", "--report-to",
            "none", "--progress", "off", "--output-dir", output_dir]


def refuse(script_args: Sequence[str], hostfile: str | None, nnodes: int | None) -> None:
    """What auto cannot do, each in one line with the fix (a script other than train.py: launch_args.check)."""
    if hostfile or (nnodes or 1) > 1:
        raise CoreCPUError("auto measures on this node only; give the ranks per node for several nodes "
                           "(e.g. -f hosts --ppn 4), as auto chose them here")
    if any(a == "--resume" or a.startswith("--resume=") for a in script_args):
        raise CoreCPUError("auto chooses the rank count before training; resume with the rank count the run "
                           "started with (its config.json says), not auto")


def global_batch(config: Mapping[str, object], default_batch: int, requested: int | None, *,
                 auto: bool = True) -> int:
    """G: --global-batch-size, else (auto) twice the task's per-rank default. A per-rank --batch-size as well
    would either make the global batch follow auto's rank count or contradict G: refused, with the fix."""
    if int(config["batch_size"]) != default_batch:  # type: ignore[call-overload]
        if auto:
            raise CoreCPUError(f"auto chooses the rank count, so --batch-size {config['batch_size']} (per rank) would "
                               "change the global batch with it; give --global-batch-size G instead")
        raise CoreCPUError(f"--batch-size {config['batch_size']} (per rank) and --global-batch-size {requested} "
                           "both set the batch; give one of them")
    return requested or 2 * default_batch


def fixed_ranks_batch(script_args: Sequence[str], nranks: int | None, requested: int) -> int:
    """`--global-batch-size G` with a fixed rank count: the per-rank --batch-size it means."""
    if nranks is None:
        raise CoreCPUError("--global-batch-size needs the number of ranks in all: -n N (or ./launch.sh N)")
    config, default = _parse(script_args)
    g = global_batch(config.to_dict(), default, requested, auto=False)
    per, rest = divmod(g, nranks * config.grad_accum)
    if rest or not per:
        raise CoreCPUError(f"--global-batch-size {g} does not split over {nranks} ranks x --grad-accum "
                           f"{config.grad_accum}; give a multiple of {nranks * config.grad_accum}")
    return per


def _parse(script_args: Sequence[str]):  # noqa: ANN202 - (TrainConfig, the task's default per-rank batch)
    """train.py's flags as train.py reads them, and the task's default --batch-size."""
    from corecpu.tasks.registry import parse_config  # torch and transformers: only when a batch must be worked out

    config = parse_config(list(script_args))
    return config, type(config.task_options).default_batch_size if config.task_options else config.batch_size


def dry_trial(ranks: int, args: list[str], out: Path) -> tuple[float | None, str]:
    """--dry-run runs nothing: choose() says what it would measure instead of calling this."""
    raise AssertionError("a dry run trains no trial")


Trial = Callable[[int, list[str], Path], "tuple[float | None, str]"]
PARSED_FILE = "auto_parsed.json"  # under the cache directory: a command line's job config, parsed once
PARSED_VERSION = 1


def parsed_key(script_args: Sequence[str], requested_global: int | None) -> str | None:
    """Pure apart from reading a --config file. The command line without --output-dir (a new one each run is
    common; it changes no step), the global batch asked for and a --config file's bytes; None if that file
    cannot be read (train.py's parser then says why)."""
    words, skip, extra = [], False, b""
    for i, word in enumerate(script_args):
        if skip:
            skip = False
            continue
        if word == "--output-dir":
            skip = True
            continue
        if word.startswith("--output-dir="):
            continue
        if word == "--config" and i + 1 < len(script_args) or word.startswith("--config="):
            path = word.split("=", 1)[1] if "=" in word else script_args[i + 1]
            try:
                extra += Path(path).read_bytes()
            except OSError:
                return None
        words.append(word)
    digest = hashlib.sha256(json.dumps([words, requested_global]).encode() + extra).hexdigest()[:24]
    return f"{digest}|torch={rank_history.installed_torch()}"


def job_config(script_args: Sequence[str], requested_global: int | None,
               env: Mapping[str, str]) -> tuple[int, int, dict[str, object]]:
    """(global batch, grad_accum, the shape's flags) of this command line. train.py's parser loads torch and
    transformers (2-4 s here), so a command line auto has seen is read back from the cache instead."""
    key = parsed_key(script_args, requested_global)
    path = envvars.cache_dir(env) / PARSED_FILE
    known = cachefile.read_entries(path, PARSED_VERSION).get(key or "")
    if known:
        return int(known["global_batch"]), int(known["grad_accum"]), dict(known["config"])
    base, default = _parse(script_args)
    g = global_batch(base.to_dict(), default, requested_global)
    config = {k: v for k, v in base.to_dict().items() if k in (*rank_history.SHAPE_FLAGS, "grad_accum")}
    if key:
        cachefile.store_entry(path, PARSED_VERSION, key, {"global_batch": g, "grad_accum": base.grad_accum,
                                                         "config": config}, "auto's parsed command lines")
    return g, base.grad_accum, config


def choose(script_args: Sequence[str], requested_global: int | None, cores: int, node_cpus: int, binding: str,
           env: Mapping[str, str], run_trial: Trial, say: Callable[[str], None]) -> RankChoice | None:
    """Read the history; trial what it lacks (`run_trial(ranks, args, dir) -> (samples/s or None, last line)`);
    choose. With `dry_trial`, a choice the history does not settle is only described (None)."""
    g, accum, config = job_config(script_args, requested_global, env)
    ranks = candidates(cores, g, accum)
    if not ranks:
        raise CoreCPUError(f"no rank count splits the global batch of {g} over {CORES_NOTE} ({cores}) with "
                           f"--grad-accum {accum}; give --global-batch-size a multiple of {accum * 2}")
    # One key for every candidate: the global batch, not the rank count, is part of a job's shape.
    busy = bool(env.get(envvars.CPUS_BUSY))

    def shape_at(loaded: bool) -> rank_history.JobShape:
        return rank_history.job_shape({**config, "batch_size": g // (ranks[0] * accum)}, binding,
                                      cpu_model=read_cpu_features().model_name, node_cpus=node_cpus,
                                      world_size=ranks[0], local_world_size=ranks[0], busy=loaded)
    shape = shape_at(busy)

    def recorded() -> dict[int, float]:
        entry = rank_history.read(shape, env)
        return {n: m for n in ranks if (m := rank_history.median(entry.get(str(n)))) is not None}

    rates, failed, trialled = recorded(), {}, []
    missing = [n for n in ranks if n not in rates]
    if missing and run_trial is dry_trial:
        known = ", ".join(f"{n}: {r:.1f}" for n, r in sorted(rates.items())) or "none"
        say(f"# auto would measure {', '.join(map(str, missing))} rank(s) per node ({TRIAL_STEPS}-step trials, "
            f"global batch {g}; recorded samples/s: {known}), then launch the fastest")
        return None
    if missing:
        say(f"auto: measuring {', '.join(map(str, missing))} rank(s) per node ({TRIAL_STEPS} steps each, global batch "
            f"{g}); once per job and machine{_why_again(busy, rank_history.read(shape_at(not busy), env))}")
    work = Path(tempfile.mkdtemp(prefix="corecpu-auto-"))
    try:
        for n in missing:
            out = work / f"ranks-{n}"
            rate, last = run_trial(n, trial_args(script_args, g // (n * accum), str(out)), out)
            trialled.append(n)
            if rate is None:
                failed[n] = last
                say(f"auto: {n} rank(s) per node failed: {last}")
                continue
            say(f"auto: {n} rank(s) per node: {rate:.1f} samples/s")
            rates[n] = recorded().get(n, rate)  # the history's median where it stored the trial
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not rates:
        raise CoreCPUError(f"auto: every trial failed ({'; '.join(f'{n}: {w}' for n, w in failed.items())}); fix "
                           "that, or give the number of ranks")
    best = pick(rates)
    return RankChoice(best, g // (best * accum), g, MappingProxyType(dict(rates)), tuple(trialled),
                      MappingProxyType(dict(failed)))


def _why_again(busy: bool, other_state: Mapping[str, object]) -> str:
    """Why a job auto has chosen for before is measured again: its records were taken in the other load state."""
    if not other_state:
        return ""
    if busy:
        return ("; again now: some CPUs were busy at start, and this job's records are of idle starts (a timing "
                "taken beside a neighbour is kept apart from them)")
    return "; again now: the CPUs were idle at start, and this job's records were taken beside a busy neighbour"


def subprocess_trial(script: str, module: str | None, launcher: str | None, env: Mapping[str, str]) -> Trial:
    """A trial through `corecpu launch` itself, its output in its directory's log; the rate from its summary.json."""
    def run(ranks: int, args: list[str], out: Path) -> tuple[float | None, str]:
        out.mkdir(parents=True, exist_ok=True)
        target = ["train"] if module else [script]
        cmd = [sys.executable, "-m", "corecpu.launch", *(["--launcher", launcher] if launcher else []),
               "-n", str(ranks), *target, *args]
        log = out.parent / f"{out.name}.log"
        with log.open("w") as fh:
            code = subprocess.run(cmd, env=dict(env), stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL).returncode
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
        try:
            rate = json.loads((out / "summary.json").read_text()).get("samples_per_s_after_warmup")
        except (OSError, ValueError):
            rate = None
        if code != 0 or not rate:
            return None, (lines[-1][:200] if lines else f"exit {code}")
        return float(rate), ""
    return run


__all__ = ["RankChoice", "candidates", "choose", "pick", "refuse", "subprocess_trial", "trial_args"]
