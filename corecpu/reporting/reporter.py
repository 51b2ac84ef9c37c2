"""What a run tells people and tools: start-up lines, progress, metrics.jsonl, config.json,
topology.json, summary.json and the exported final/ model.

Rank 0 writes. Every rank constructs a `Reporter` and calls the same methods in the same
order: a log step reduces the step sums across ranks, and finish() gathers every rank's
summary. start() writes config.json with the resolved choices, so it comes after run.wrap().
Every file and final/ is replaced atomically (corecpu.atomic); summary.json is written last, so a
summary always names a final/ that exists.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from corecpu.reporting import cpu_taken, rank_history, rank_wait
from corecpu.reporting.console import make_console, make_progress
from corecpu.reporting.metrics_log import MetricsLog, Throughput, format_step
from corecpu.reporting.trackers import open_trackers
from corecpu.compute import flops
from corecpu.compute.wrappers import saving_unwrapped, unwrap
from corecpu.cpu import contention
from corecpu.cpu.cpulist import format_cpu_list
from corecpu.cpu.hardware import read_cpu_features
from corecpu.cpu.topology import read_topology
from corecpu.cpu.memory_use import memory_use, peak_rss_mb
from corecpu import atomic, envvars, notices
from corecpu.errors import CoreCPUError
from corecpu.training import label_logits
from corecpu.training.checkpoint_disk import process_start
from corecpu.training.run import Run
from corecpu.training.schedule import StepStats
from corecpu.training.steps import Step


class Reporter:
    def __init__(self, run: Run, output_dir: str | Path, config: dict[str, Any], total_steps: int,
                 progress: str = "auto", resume_step: int | None = None, trackers: Sequence[str] = (),
                 log_every: int = 10, env: Mapping[str, str] | None = None) -> None:
        """`env`: where the launcher's variables (CORECPU_TTY, the launcher's PID) and the trackers' settings
        are read; None: this process's environment, read here once for all of reporting."""
        self.run, self.out, self.total_steps, self.log_every = run, Path(output_dir), total_steps, log_every
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.console = make_console(self.env)
        self.main = run.is_main
        self.reports = [dict(b) for b in run.bindings]  # every rank's real CPUs and threads, gathered by setup()
        self.metrics: MetricsLog | None = None
        self.progress = make_progress(progress, self.console, self.env) if self.main else None
        self._task = None
        self.config = config
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.metrics = MetricsLog(self.out / "metrics.jsonl", resume_step,
                                      open_trackers(trackers, self.out, config, env=self.env, rank=run.rank))
        run.on_log(self.log)  # run.log() in a task or a loop: the same metrics.jsonl and trackers
        self.started = time.perf_counter()
        self.start_up_s: float | None = None  # launcher start to the training loop (set by start())
        self._interval = Throughput()
        self._timed_from: float | None = None  # the summary's throughput skips the first log interval (warm-up)
        self._timed_to: float | None = None
        self._timed_samples = 0.0
        self._timed_tokens = 0.0
        self._timed_flops = 0.0
        self._flops: flops.FlopCount | None = None  # what a token costs: for MFU (set by start(), after wrap())
        self.matmul: dict[str, Any] | None = None  # the job's measured matmul rate in the run's precision
        self._matmul_key = ""  # its cache key on this host (flops.cache_key)
        self._stats = StepStats()
        self._start_step = 0  # the step the loop (re)started at: the ETA divides by the steps since
        self._eval_started: float | None = None
        self._last_step = 0  # the last step logged (its loss was finite)
        self.last_loss: float | None = None
        self.last_eval: dict[str, float] | None = None
        self._shape: rank_history.JobShape | None = None  # rank 0's: samples/s per rank count (start() sets it)
        self._advised = False  # start() already said another rank count trained this job faster
        self.waits = rank_wait.WaitLog(self.started)  # how long the ranks waited for each other (shared step)
        self.taken = cpu_taken.TakenLog()  # how much of each rank's CPUs others took (every log step's totals)
        self._cpus = contention.watched_cpus(run.rank, self.reports) if self.env.get(envvars.WATCH_CPUS) != "0" else []
        self._cpu_start: contention.CpuTimes | None = None

    # ------------------------------------------------------------ lines for people
    def say(self, text: str) -> None:
        if not self.main:
            return
        (self.progress.console if self.progress else self.console).print(text)

    def start(self, step: int) -> None:
        """As the loop starts (after run.wrap(): the precision is settled): config.json, topology.json, progress."""
        self._measure_matmul()
        self.started = time.perf_counter()
        self.waits = rank_wait.WaitLog(self.started)
        self.taken = cpu_taken.TakenLog()
        self._cpu_start = contention.sample(self._cpus) if self._cpus else None
        self._start_step = step
        self.start_up_s = seconds_since_launch(self.env)
        if self.main:
            self._write("config.json", {**self.config, "resolved": self.run.resolved(), "decisions": self.run.describe()})
            self._write("topology.json", {"ranks": self.reports})
            self._shape = self._job_shape()
            line = rank_history.advice(rank_history.read(self._shape, self.env), self._shape)
            if line:
                notices.warn(line, env=self.env)
                self._advised = True
        if self.progress:
            self._task = self.progress.add_task("train", total=self.total_steps, completed=step, status="")
            self.progress.start()

    def _measure_matmul(self) -> None:
        """Collective: every rank's matmul rate in the run's precision (cached per machine), summed: what MFU
        divides by. Needs run.wrap() (the model and the precision); without it there is no MFU."""
        model, precision = self.run.model, self.run.precision
        if model is None or precision is None:
            return
        key = flops.cache_key(read_cpu_features().model_name, precision.name, self.run.threads,
                              self.run.launch.local_world_size, busy=bool(self.env.get(envvars.CPUS_BUSY)))
        rate, cached = flops.rank_matmul_rate(precision.name, key)
        self._matmul_key = key
        job = self.run.all_reduce_sum([rate])[0]
        self._flops = flops.count_flops(model, head_on_labels=label_logits.is_applied(model))
        self.matmul = {"precision": precision.name, "job_flops": job, "ranks": self.run.world_size,
                       "size": flops.MATMUL_SIZE, "cached": cached, "non_embedding_params": self._flops.params}

    def _mfu(self, flops_per_s: float) -> float | None:
        if self.matmul is None or "outrun" in self.matmul:
            return None
        value = flops.mfu(flops_per_s, self.matmul["job_flops"])
        if value is not None and value > 1.0 and self.main:
            self._outrun(value)
            return None
        return round(value, 4) if value is not None else None

    def _outrun(self, value: float) -> None:
        """The model ran faster than the matmul rate it is measured against: that rate was timed while something
        else ran. Rank 0 (which alone reports) stops showing MFU, says why, and has the next run time it again."""
        assert self.matmul is not None
        again = flops.suspect(self._matmul_key)
        self.matmul["outrun"] = f"MFU {value:.0%} in a log interval; no MFU reported after it"
        rate = self.matmul["job_flops"] / 1e9 / self.matmul["ranks"]
        notices.warn(f"this run's model outran the matmul rate {'cached' if self.matmul['cached'] else 'measured'} "
                     f"for this machine ({rate:.1f} GFLOP/s a rank; MFU {value:.0%}), so that rate was timed while "
                     f"something else ran; MFU is not reported for the rest of this run"
                     + (", and the next run times it again" if again else ""), env=self.env)

    def _job_shape(self, busy: bool = False) -> rank_history.JobShape:
        """`busy`: as if the launcher had found CPUs busy at start, whatever it found."""
        node_cpus = len(read_topology(allowed_from_cpuset=True, env=self.env).allowed)
        return rank_history.job_shape(self.config, self.run.binding, cpu_model=read_cpu_features().model_name,
                                      node_cpus=node_cpus, world_size=self.run.world_size,
                                      local_world_size=self.run.launch.local_world_size,
                                      busy=busy or bool(self.env.get(envvars.CPUS_BUSY)))

    def advance(self, step: int, status: str) -> None:
        if self.progress:
            self.progress.update(self._task, completed=step, status=status)

    # ------------------------------------------------------------ records for tools
    def add(self, loss: torch.Tensor, samples: int, meta: Mapping[str, Any], weight: float | None = None) -> None:
        """After each micro-batch: summed on this rank, without a host sync, until the next record. `meta`: the
        batch's popped META_KEYS (corecpu.data.tokenized): its real and padded tokens, and what MFU counts.
        `weight`: what `loss` is the mean over, when not its samples (step.weight: label tokens)."""
        tokens = meta["num_tokens"]
        work = (self._flops.batch(tokens, meta.get("num_attended"), meta.get("num_label_tokens"), samples)
                if self._flops else 0.0)
        self._stats.add(loss, samples, tokens, meta.get("num_padded", 0), weight, work)

    def step_done(self, step: Step, lr: float, grad_norm: torch.Tensor | float | None = None) -> None:
        """After each optimizer step on every rank: a record every `log_every` steps and at the last one
        (reducing the sums across ranks only then), and the progress bar. `grad_norm`: what clip_grad_norm_
        returned (the same on every rank); read, like the loss, only on a log step: the logged step's own."""
        if step.number % self.log_every == 0 or step.is_last:
            waited = self.run.waited_s  # measured on every rank or on none (the shared step is collective)
            values = {"peak_rss_mb": peak_rss_mb(), **({"waited_s": waited} if waited is not None else {}),
                      **dict(zip(("cpu_others_s", "cpu_steal_s", "cpu_counted_s"), self._cpu_totals()))}
            stats = self._stats.reduce(self.run.all_reduce_sum, rank=self.run.rank, world_size=self.run.world_size,
                                       rank_values=list(values.values()))
            stats["by_rank"] = dict(zip(values, stats["per_rank"]))
            if not math.isfinite(stats["loss"]):  # the same reduced value on every rank: all stop together
                since = f" (finite at step {self._last_step})" if self._last_step else ""
                raise CoreCPUError(f"the training loss became {stats['loss']} by step {step.number}{since}; stopped "
                                   "without saving it over the last checkpoint; lower --lr, or check the data")
            self._last_step = step.number
            self.log_step(step.number, step.epochs_done, lr, stats, grad_norm=None if grad_norm is None
                          else float(grad_norm))
        self.advance(step.number, f"epoch {step.epoch + 1}/{step.epochs}")

    def log_step(self, step: int, epoch: float, lr: float, stats: Mapping[str, Any],
                 grad_norm: float | None = None) -> dict[str, Any]:
        """One training record from already-reduced `stats` (StepStats.reduce). `epoch` is fractional (1.0 at the
        end of the first); `learning_rate`, `grad_norm` and `epoch` are transformers' names, so dashboards line
        up with a Trainer's runs; `lr` stays for the readers of earlier records."""
        sps, tps, fps = self._interval.rates(stats["samples"], stats["tokens"], stats.get("flops", 0.0))
        now = time.perf_counter()
        if self._timed_from is None:
            self._timed_from = now
        else:
            self._timed_samples, self._timed_to = self._timed_samples + stats["samples"], now
            self._timed_tokens += stats["tokens"]
            self._timed_flops += stats.get("flops", 0.0)
        self.last_loss = stats["loss"]
        record: dict[str, Any] = {"step": step, "epoch": round(epoch, 4), "loss": stats["loss"], "lr": lr,
                                  "learning_rate": lr}
        if grad_norm is not None:  # null when not finite (a step clipping cannot save): metrics.jsonl stays JSON
            record["grad_norm"] = grad_norm if math.isfinite(grad_norm) else None
        record.update({"samples": int(stats["samples"]), "tokens": int(stats["tokens"]), "samples_per_s": sps,
                       "tokens_per_s": tps, "elapsed_s": round(now - self.started, 4)})
        if "padding" in stats:
            record["padding"] = round(stats["padding"], 4)
        if (utilisation := self._mfu(fps)) is not None:
            record["mfu"] = utilisation
        by_rank = stats.get("by_rank") or {}
        if "peak_rss_mb" in by_rank:  # every rank's peak resident set so far: the highest, and each
            record["peak_rss_mb"] = round(max(by_rank["peak_rss_mb"]), 1)
            record["rank_peak_rss_mb"] = [round(v, 1) for v in by_rank["peak_rss_mb"]]
        if "waited_s" in by_rank:  # every rank's seconds waited for the others so far
            record.update(self.waits.record(now, by_rank["waited_s"]))
        if "cpu_counted_s" in by_rank:  # what other processes and the hypervisor took of each rank's CPUs
            record.update(self.taken.record(by_rank["cpu_others_s"], by_rank["cpu_steal_s"], by_rank["cpu_counted_s"]))
        if self.metrics:
            self.metrics.write(record)
            done = step - self._start_step
            per_step = (now - self.started) / done if done > 0 else None
            self.say(format_step(record, self.total_steps, per_step))
        return record

    def evaluating(self, step: int, batches: int | None = None) -> None:
        """As an evaluation starts, on every rank: a line now (an evaluation can take minutes) and the bar's
        status; log_eval() then says how long it took."""
        self._eval_started = time.perf_counter()
        self.advance(step, "evaluating")
        if self.main and not self.progress:
            self.say(f"eval  step {step}: evaluating" + (f" ({batches} batches per rank)..." if batches else "..."))

    def log_eval(self, step: int, epoch: float, scores: dict[str, float], line: str | None = None) -> None:
        """One evaluation's scores (already reduced over ranks) as a record, and `line` for people; with
        evaluating() called first, its duration too (transformers' eval_runtime)."""
        self.last_eval = scores
        record: dict[str, Any] = {"step": step, "epoch": round(epoch, 4), **scores}
        if self._eval_started is not None:
            record["eval_runtime"] = round(time.perf_counter() - self._eval_started, 3)
            self._eval_started = None
        if self.metrics:
            self.metrics.write(record)
            line = line or "eval  step {} | ".format(step) + " | ".join(f"{k} {v:.4f}" for k, v in scores.items())
            self.say(line + (f" | {record['eval_runtime']:.1f} s" if "eval_runtime" in record else ""))

    def log(self, values: Mapping[str, Any], step: int) -> None:
        """A record of the loop's own (run.log()): metrics.jsonl and the trackers, on rank 0."""
        if self.metrics:
            self.metrics.write({"step": step, **values})

    @property
    def samples_per_s(self) -> float | None:
        if self._timed_to is None or self._timed_from is None:
            return None
        return self._timed_samples / max(self._timed_to - self._timed_from, 1e-9)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation after the first log interval (warm-up), as samples_per_s."""
        if self._timed_to is None or self._timed_from is None:
            return None
        return self._mfu(self._timed_flops / max(self._timed_to - self._timed_from, 1e-9))

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None
        if self.metrics:
            self.metrics.close()
            self.metrics = None

    # ------------------------------------------------------------ the end
    def finish(self, model: torch.nn.Module, tokenizer: Any, steps: int,
               card: Callable[[Path, dict[str, Any]], Any] | None = None) -> Path | None:
        """final/ (export_final), then summary.json (every rank's loss and weight checksum: DDP replicas
        must agree), last. Collective."""
        if self.progress:
            self.progress.stop()
            self.progress = None
        model = unwrap(model)
        elapsed = time.perf_counter() - self.started
        views = self.run.gather({"rank": self.run.rank, "host": self.reports[self.run.rank]["host"], "steps": steps,
                                 "final_loss": self.last_loss,
                                 "param_checksum": float(sum(p.detach().double().sum() for p in model.parameters())),
                                 **memory_use()})
        final = None
        if self.main:
            summary = {"steps": steps, "seconds": elapsed, "final_loss": self.last_loss, "last_eval": self.last_eval,
                       "samples_per_s_after_warmup": self.samples_per_s, "mfu_after_warmup": self.mfu,
                       **self.waits.summary(), **self.taken.summary(),
                       "matmul": self.matmul, "resolved": self.run.resolved(),
                       "peak_rss_mb": max((v["peak_rss_mb"] for v in views), default=None),  # the highest rank's
                       "ranks": views}
            saving = time.perf_counter()
            final = export_final(self.out / "final", model, tokenizer, summary, card)
            if self.metrics:
                self.metrics.log_model(final)  # HF_MLFLOW_LOG_ARTIFACTS, WANDB_LOG_MODEL
            summary["phases"] = phase_split(self.start_up_s, elapsed, self.run.untimed_seconds,
                                            time.perf_counter() - saving)
            self._write("summary.json", summary)  # last: a kill before this leaves no summary of this end
            rate = f"{self.samples_per_s:.1f} samples/s after the first log interval" if self.samples_per_s else "n/a"
            rate += f", MFU {self.mfu:.1%}" if self.mfu is not None else ""
            waited = summary["wait_after_warmup"]
            rate += f", ranks waited {waited:.1%} of it for each other" if waited is not None else ""
            self.say(f"done: {steps} steps in {elapsed:.1f}s ({rate}); model saved to [bold]{final}[/]")
            taken = self.taken.taken()
            self._record_rate(steps, shared=bool(taken))
            cpus = [format_cpu_list(b.get("cpus") or []) for b in self.reports]
            window = self.taken.window or []
            # A straggler's line says what held it back; without one, ranks whose CPUs were taken get their own.
            line = (self.waits.straggler_line(cpus, lambda r: cpu_taken.cause(window[r] if r < len(window) else None))
                    or cpu_taken.line(taken, cpus))
            if line:
                notices.warn(line, env=self.env)
        self.close()
        self.run.barrier()
        return final

    def _cpu_totals(self) -> tuple[float, float, float]:
        """This rank's CPUs since the loop started: seconds other processes ran on them, seconds stolen from them,
        seconds counted (all 0 where they are not watched: the log step's all-reduce has the same width on every
        rank)."""
        if self._cpu_start is None or (now := contention.sample(self._cpus)) is None:
            return 0.0, 0.0, 0.0
        return contention.elsewhere(self._cpu_start, now)

    def _record_rate(self, steps: int, shared: bool = False) -> None:
        """This run's samples/s into the rank-count history, and a line when another rank count did better.
        `shared`: other processes or the hypervisor took the CPUs of some rank while it trained; the rate then goes
        with those of runs that started beside a busy neighbour, which an idle start never reads."""
        if self._shape is None:
            return
        shape = self._job_shape(busy=True) if shared else self._shape
        entry = rank_history.store(shape, self.samples_per_s, steps - self._start_step, self.env)
        line = (rank_history.advice(entry, shape, self.samples_per_s)
                if entry and not self._advised and not shared else None)
        if line:
            notices.warn(line, env=self.env)

    def _write(self, name: str, obj: Any) -> None:
        # Strict JSON: a NaN or infinity becomes null rather than a bare NaN that JSON readers reject.
        atomic.write_json(self.out / name, _finite(obj), indent=2, allow_nan=False)


def export_final(final: Path, model: Any, tokenizer: Any, summary: dict[str, Any],
                 card: Callable[[Path, dict[str, Any]], Any] | None = None) -> Path:
    """The model as save_pretrained (safetensors), its tokenizer and `card(dir, summary)`, written to a
    temporary directory that replaces `final` only once complete: a kill keeps the old final/ or the new."""
    with atomic.replacing_dir(final) as staging, saving_unwrapped():
        model.save_pretrained(staging, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if card is not None:
            card(staging, summary)
    return final


def seconds_since_launch(env: Mapping[str, str]) -> float | None:
    """Seconds since the launcher (corecpu launch / launch.sh, else this process) started, from /proc."""
    pid = int(env[envvars.LAUNCHER_PID]) if env.get(envvars.LAUNCHER_PID, "").isdigit() else os.getpid()
    ticks = process_start(pid) or process_start(os.getpid())
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - int(ticks) / os.sysconf("SC_CLK_TCK"), 2) if ticks else None
    except (OSError, ValueError):
        return None


def phase_split(start_up: float | None, loop: float, untimed: Mapping[str, float], final_save: float) -> dict[str, Any]:
    """Pure: where rank 0's wall time went, in seconds. `loop` is the training loop's time, which holds the
    evaluations and checkpoint writes (`untimed`); steps are the rest of it."""
    eval_s, ckpt_s = untimed.get("eval", 0.0), untimed.get("checkpoint", 0.0)
    return {"start_up_s": start_up, "steps_s": round(loop - eval_s - ckpt_s - untimed.get("other", 0.0), 3),
            "eval_s": round(eval_s, 3), "checkpoint_s": round(ckpt_s, 3), "final_save_s": round(final_save, 3)}


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
