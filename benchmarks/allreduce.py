"""fp32 all-reduce on one host: gloo vs Intel MPI (raw mpi4py, and corecpu's comm-thread path)
vs oneCCL (`ccl`, when `corecpu build-ccl` has installed the bindings) vs DeepSpeed's shared-memory op on
corecpu's comm thread (`shm`, fp32 and bf16 on the wire, when the `shm` extra is installed) vs a
single-process memcpy of the same size (the memory-bandwidth bound). Sizes are of the fp32 buffer: the bf16
wire moves half the bytes, and its time includes rounding to bf16 and back.

    .venv/bin/python benchmarks/allreduce.py                       # 1/32/128 MB, 2 ranks, 7 repeats
    .venv/bin/python benchmarks/allreduce.py --sizes-mb 1,4 --repeats 3
    I_MPI_ADJUST_ALLREDUCE=2 .venv/bin/python benchmarks/allreduce.py --out /tmp/x.json   # try an algorithm
    .venv/bin/python benchmarks/allreduce.py --report benchmarks/results/allreduce-n2.json  # re-print only
    .venv/bin/python benchmarks/allreduce.py --ccl-settings all    # one run per oneCCL setting in CCL_SETTINGS

It re-runs itself under `mpirun -n N` (Intel MPI). Each rank pins itself to one CPU and
one thread. Per size, the methods run interleaved (order rotated every repeat); each
sample is the mean time of a block of back-to-back operations on rank 0; medians over
the repeats are reported. The memcpy runs on rank 0 alone while the others sleep in a
gloo barrier. Results go to benchmarks/results/allreduce-n<N>.json and a markdown table.
oneCCL reads its settings once per process, so each setting is its own run (gloo in every run is the
reference); `ccl` is a second process group beside the gloo one, with the setting's CCL_* variables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("gloo", "mpi_thread", "mpi_raw", "ccl", "shm", "shm_bf16", "memcpy")
LABELS = {"gloo": "gloo", "mpi_thread": "MPI, comm thread (corecpu)", "mpi_raw": "MPI, raw mpi4py",
          "ccl": "oneCCL", "shm": "shm, comm thread (corecpu)", "shm_bf16": "shm, bf16 wire",
          "memcpy": "memcpy, 1 process"}
# oneCCL settings tried (name -> CCL_* variables; anything unset is oneCCL's default). "plan" is what
# corecpu's plan sets where a rank has no core to spare for a worker (corecpu/cpu/ccl_workers.py).
CCL_SETTINGS = {
    "defaults": {},
    "offload0": {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_TRANSPORT": "ofi"},
    "plan": {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_TRANSPORT": "ofi", "CCL_ATL_SHM": "1"},
    "mpi": {"CCL_WORKER_OFFLOAD": "0", "CCL_ATL_TRANSPORT": "mpi"},
}
MiB = 1 << 20


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes-mb", default="1,32,128", help="comma list of buffer sizes in MiB (fp32)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved rounds of all methods")
    p.add_argument("--target-s", type=float, default=0.25, help="approximate seconds per timed block")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/allreduce-nN.json)")
    p.add_argument("--report", type=Path, default=None, help="print the table of an existing JSON and stop")
    p.add_argument("--ccl-settings", default="plan",
                   help=f"comma list of oneCCL settings to run, one run each, or all ({', '.join(CCL_SETTINGS)})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown"


# ---------------------------------------------------------------- one rank (under mpirun)


def worker(args: argparse.Namespace) -> None:
    from corecpu.cluster.launchers import detect_launcher

    info = detect_launcher(os.environ)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[info.local_rank % len(cpus)]})
    os.environ["OMP_NUM_THREADS"] = "1"

    import numpy as np
    import torch
    import torch.distributed as dist

    import corecpu
    from corecpu.distributed.allreduce import GradientAllreduce, make_gradient_allreduce
    from corecpu.errors import CoreCPUError

    ctx = corecpu.setup(backend="gloo", allreduce="gloo", threads=1, dist_timeout=60)
    comm = make_gradient_allreduce("mpi", ctx.launch)
    hooks: dict[str, GradientAllreduce] = {}
    try:
        hooks = {"shm": make_gradient_allreduce("shm", ctx.launch),
                 "shm_bf16": make_gradient_allreduce("shm", ctx.launch, wire="bf16")}
    except CoreCPUError as exc:
        if ctx.rank == 0:
            print(f"allreduce.py: no shm: {exc}", file=sys.stderr, flush=True)
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401  (registers "ccl")
        ccl_group = dist.new_group(backend="ccl")
    except ImportError:
        ccl_group = None
    methods = tuple(m for m in METHODS if (m != "ccl" or ccl_group is not None)
                    and (not m.startswith("shm") or m in hooks))
    from mpi4py import MPI

    raw = comm.comm
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    buf = {s: torch.ones(int(s * MiB) // 4, dtype=torch.float32) for s in sizes}
    dst = {s: torch.empty_like(b) for s, b in buf.items()}

    def op(method: str, size: float) -> Callable[[], None]:
        t, a = buf[size], buf[size].numpy()
        if method == "gloo":
            return lambda: dist.all_reduce(t)
        if method == "ccl":
            return lambda: dist.all_reduce(t, group=ccl_group)
        if method == "mpi_raw":
            return lambda: raw.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        if method == "mpi_thread":
            return lambda: comm.allreduce_async(t).wait()
        if method in hooks:
            hook = hooks[method]
            return lambda: hook.allreduce_async(t).wait()
        d = dst[size].numpy()
        return lambda: np.copyto(d, a)

    def block(method: str, size: float, n: int) -> float:
        """Mean seconds per op over n ops on this rank (memcpy: rank 0 alone)."""
        buf[size].fill_(1.0)  # in-place sums double the values: keep them far from overflow
        dist.barrier()
        if method == "memcpy" and ctx.rank != 0:
            dist.barrier()  # sleep in gloo (no busy polling) while rank 0 copies
            return float("nan")
        f = op(method, size)
        start = time.perf_counter()
        for _ in range(n):
            f()
        elapsed = (time.perf_counter() - start) / n
        if method == "memcpy":
            dist.barrier()
        return elapsed

    # Block lengths from a first timing on rank 0, shared so every rank runs the same count.
    counts: dict[tuple[str, float], int] = {}
    for size in sizes:
        for method in methods:
            block(method, size, 1)  # warm-up: first touch, MPI/gloo buffers
            one = block(method, size, 2)
            n = torch.tensor([max(2, min(100, int(args.target_s / max(one, 1e-6))))] if ctx.rank == 0 else [0])
            dist.broadcast(n, 0)
            counts[(method, size)] = int(n)

    samples: dict[str, dict[str, list[float]]] = {str(s): {m: [] for m in methods} for s in sizes}
    for r in range(args.repeats):
        for size in sizes:
            order = methods[r % len(methods):] + methods[: r % len(methods)]
            for method in order:
                samples[str(size)][method].append(block(method, size, counts[(method, size)]))
    for closing in (comm, *hooks.values()):
        closing.close()
    if ccl_group is not None:
        dist.destroy_process_group(ccl_group)
    if ctx.rank == 0:
        result = {
            "cpu": cpu_model(), "host": socket.gethostname(), "ranks": ctx.world_size,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mpi": MPI.Get_library_version().splitlines()[0].strip(), "torch": torch.__version__,
            "i_mpi_env": {k: v for k, v in os.environ.items() if k.startswith("I_MPI_")},
            "ccl_setting": os.environ.get("CORECPU_BENCH_CCL", ""),
            "ccl_env": {k: v for k, v in os.environ.items() if k.startswith("CCL_")},
            "repeats": args.repeats, "ops_per_sample": {f"{m}@{s}": n for (m, s), n in counts.items()},
            "seconds": samples,
            "median_ms": {s: {m: 1e3 * statistics.median(v) for m, v in by.items()} for s, by in samples.items()},
        }
        Path(os.environ["CORECPU_BENCH_OUT"]).write_text(json.dumps(result, indent=2))
    ctx.close()


# ---------------------------------------------------------------- driver


RATIOS = {"mpi_thread": "comm thread vs gloo", "mpi_raw": "raw vs gloo", "ccl": "ccl vs gloo", "shm": "shm vs gloo",
          "shm_bf16": "shm bf16 vs gloo"}


def table(result: dict[str, Any]) -> str:
    methods = [m for m in METHODS if m in next(iter(result["median_ms"].values()))]
    ratios = [m for m in RATIOS if m in methods]
    setting = f", oneCCL setting {result['ccl_setting']} {result.get('ccl_env', {})}" if "ccl" in methods else ""
    lines = [f"{result['ranks']} ranks, fp32 buffers, {result['cpu']}, {result['mpi']}, torch {result['torch']}{setting}, "
             f"median of {result['repeats']} interleaved repeats ({result['date']})", "",
             "| size | " + " | ".join(f"{LABELS[m]} ms" for m in methods) + " | "
             + " | ".join(RATIOS[m] for m in ratios) + " |",
             "|---:|" + "---:|" * (len(methods) + len(ratios))]
    for size, ms in result["median_ms"].items():
        cells = " | ".join(f"{ms[m]:.3f}" for m in methods)
        lines.append(f"| {float(size):g} MB | {cells} | " + " | ".join(f"{ms['gloo'] / ms[m]:.2f}x" for m in ratios) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    if args.report:
        print(table(json.loads(args.report.read_text())))
        return
    names = list(CCL_SETTINGS) if args.ccl_settings == "all" else args.ccl_settings.split(",")
    unknown = [n for n in names if n not in CCL_SETTINGS]
    if unknown:
        sys.exit(f"unknown --ccl-settings {unknown[0]!r}; choose from {', '.join(CCL_SETTINGS)} or all")
    for name in names:
        suffix = "" if name == "plan" else f"-ccl-{name}"
        out = args.out or ROOT / "benchmarks" / "results" / f"allreduce-n{args.ranks}{suffix}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        base = {k: v for k, v in os.environ.items() if not k.startswith("CCL_")}
        env = {**base, **CCL_SETTINGS[name], "CORECPU_BENCH_CCL": name,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "I_MPI_PIN": "0", "CORECPU_BENCH_OUT": str(out),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        # The environment's own mpirun (impi-rt's, beside this Python, which finds mpiexec.hydra on PATH) even when
        # that environment is not activated.
        env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), base.get("PATH")]))
        mpirun = shutil.which("mpirun", path=env["PATH"])
        if mpirun is None:
            sys.exit("allreduce.py: no mpirun beside this Python or on PATH; ./launch.sh --setup-only installs Intel MPI's")
        cmd = [mpirun, "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()), "--worker",
               "--sizes-mb", args.sizes_mb, "--repeats", str(args.repeats), "--target-s", str(args.target_s)]
        subprocess.run(cmd, env=env, check=True)
        print(table(json.loads(out.read_text())))
        print(f"\n(written to {out})\n")


if __name__ == "__main__":
    main()
