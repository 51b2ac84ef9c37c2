"""Scaling across hosts, measured on one machine: ranks in network-namespace "hosts" on a shaped switch.

    python benchmarks/cluster.py                                   # MiniLM, 2 and 4 hosts, 1/10/25 Gb/s
    python benchmarks/cluster.py --model bert-base --hosts 2 --batch-size 8 --steps 12 --warmup 3
    python benchmarks/cluster.py --model tiny --data builtin --hosts 2 --gbits 1 --steps 8 --warmup 2  # smoke
    python benchmarks/cluster.py --report benchmarks/results/cluster-minilm-2hosts.json              # re-print
    python benchmarks/cluster.py --plot benchmarks/results/cluster-*.json                            # the figure

Each "host" is a Linux network namespace cabled to a bridge (tests/helpers/netns.py fake_hosts) with its
own CPU set (one core by default; 4 hosts on 2 cores share them two to a core), and every link is shaped
with a token bucket to the rate asked for, both ways. One rank per host. Needs root and iproute2.

What is measured, per tool (corecpu through launch.sh and Intel MPI, each --allreduce path asked for; the
Hugging Face Trainer through torchrun on every host), per host count:
- the compute-only step: the same job launched the same way with DDP's gradient all-reduce replaced by
  nothing (benchmarks/noop_allreduce.py): same ranks, CPU sets, samplers and batch shapes; so the time
  of a step without gradient traffic, with everything else (DDP's buckets, small collectives) kept;
- the step at each link rate (mean of steps W+1..S from rank 0's step timestamps, as throughput.py);
- scaling efficiency = compute-only step / step, and exposed communication = step - compute-only step:
  the time gradients add to a step after overlap with backward, which is what a faster network or a
  smaller gradient buys back.
Why not samples/s against one host: here the hosts share the machine's cores, so N hosts do not have N
times one host's compute. Comparing each job with itself minus its gradient traffic keeps the CPU share
equal and leaves the network's cost. The TCP stack's work does run on the same cores, as on a real host.

Each rate's link is checked first (TCP throughput one way, round-trip time), since on a small machine the
CPU, not the shaper, can be the limit. Results: benchmarks/results/cluster-<model>.json and a table; the
scale model (benchmarks/scale_model.py) reads that file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fake hosts are the multi-host tests' own (tests/helpers/netns.py)

import harness  # noqa: E402
import stats  # noqa: E402
from common import bert_base_random  # noqa: E402
from helpers.netns import TwoHosts, fake_hosts, shape  # noqa: E402

VARIANTS = ("corecpu", "corecpu:dense", "corecpu:gloo", "trainer")
# Named corecpu variants beside `corecpu:PATH` (= --allreduce PATH); --corecpu-args adds more.
NAMED = {"dense": "--sparse-embedding-allreduce off"}  # the whole embedding gradient in DDP's buckets
PORT = 29611
LINK_PROBE = BENCH / "link_probe.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="minilm", help="minilm, bert-base (random init, MiniLM's vocabulary), tiny, or a "
                   "model directory")
    p.add_argument("--data", default="paraphrase", help="a built-in data set")
    p.add_argument("--eval-rows", type=int, default=64, help="evaluate on this many of its eval split (the timing "
                   "leaves evaluation out; fewer rows save wall time)")
    p.add_argument("--hosts", default="2,4", help="host counts, comma-separated (2..8)")
    p.add_argument("--gbits", default="1,10,25", help="link rates in Gb/s, comma-separated; 0 = unshaped")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)}; corecpu:NAME is `--allreduce NAME`, or the flags "
                        "--corecpu-args gives NAME")
    p.add_argument("--corecpu-args", action="append", default=[], metavar="NAME=FLAGS",
                   help="train.py flags of variant corecpu:NAME, e.g. 'bf16wire=--allreduce-dtype bf16'")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=24, help="optimizer steps per run")
    p.add_argument("--warmup", type=int, default=4, help="first steps not timed")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="for every tool alike (a network benchmark: precision is not what is compared)")
    p.add_argument("--cores-per-host", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.add_argument("--work-dir", type=Path, help="run outputs and logs, kept (default: a temp dir, removed after a "
                                                 "run that completes)")
    p.add_argument("--timeout", type=float, default=900, help="per run, seconds")
    p.add_argument("--report", type=Path, help="print the tables of an earlier result file and stop")
    p.add_argument("--pool", type=Path, nargs="+", help="pool result files of the same job: each repeat's efficiency "
                   "against its own compute-only run, medians over all of them, then stop")
    p.add_argument("--plot", type=Path, nargs="+", help="plot efficiency against link rate from result files and "
                   "stop (to --out, default results/cluster-efficiency.png)")
    args = p.parse_args(argv)
    args.host_counts = [int(x) for x in args.hosts.split(",")]
    args.rates = [float(x) for x in args.gbits.split(",")]
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.corecpu_extra = {**NAMED, **harness.parse_corecpu_args(args.corecpu_args)}
    for v in args.variant_list:
        if v not in ("corecpu", "trainer") and not v.startswith("corecpu:"):
            p.error(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)} or corecpu:PATH")
    if args.warmup >= args.steps:
        p.error("--warmup must be below --steps")
    return args


# ---------------------------------------------------------------- pure planning

def host_cpus(n: int, allowed: list[int], per_host: int) -> list[str]:
    """Pure. Each host's taskset list: consecutive blocks of `per_host` CPUs, wrapping round when the hosts
    need more CPUs than there are (then hosts share cores, and the benchmark says so)."""
    if per_host < 1 or per_host > len(allowed):
        raise ValueError(f"--cores-per-host must be 1..{len(allowed)}")
    blocks = [allowed[i:i + per_host] for i in range(0, len(allowed) - per_host + 1, per_host)]
    return [",".join(map(str, blocks[i % len(blocks)])) for i in range(n)]


def efficiency(compute_ms: float, step_ms: float) -> dict[str, float]:
    """Pure. Scaling efficiency and exposed communication of one run against its compute-only reference."""
    return {"efficiency": compute_ms / step_ms, "exposed_comm_ms": step_ms - compute_ms}


def data_args(files: dict[str, str]) -> list[str]:
    pair = ["--text-pair-column", "sentence2"] if files.get("pairs") else []
    return ["--data", files["train"], "--eval-data", files["eval"], "--text-column", "sentence1", *pair,
            "--label-column", "label"]


def train_args(args: argparse.Namespace, model: str, out: Path) -> list[str]:
    """train.py's flags for every corecpu run (the all-reduce path is the variant's)."""
    return ["--model", model, *data_args(args.files), "--max-steps", str(args.steps), "--batch-size",
            str(args.batch_size), "--max-seq-len", str(args.max_seq_len), "--precision", args.precision,
            "--log-every", "1", "--progress", "off", "--output-dir", str(out)]


def trainer_args(args: argparse.Namespace, model: str, out_json: Path) -> list[str]:
    """benchmarks/hf_trainer.py's flags: the tuned Trainer (length-grouped), same batch, steps and precision."""
    return ["--model", model, *data_args(args.files), "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
            "--max-seq-len", str(args.max_seq_len), "--precision", args.precision, "--group-by-length",
            "--out-json", str(out_json)]


# ---------------------------------------------------------------- running

def write_data(name: str, eval_rows: int, work: Path) -> dict[str, str]:
    """The built-in's train split and the first `eval_rows` of its eval split as JSONL, read alike by both tools."""
    from corecpu.data.sources import load_data

    files = {}
    for split, limit in (("train", None), ("eval", eval_rows)):
        data = load_data(name, split=split)
        path = work / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for i in range(len(data) if limit is None else min(limit, len(data))):
                row = {"sentence1": data.texts[i], "label": data.label_names[data.labels[i]]}
                if data.text_pairs is not None:
                    row["sentence2"] = data.text_pairs[i]
                fh.write(json.dumps(row) + "\n")
        files[split], files["pairs"] = str(path), "1" if data.text_pairs is not None else ""
    return files


def rate_cache(work: Path, label: str) -> Path:
    """A corecpu cache directory per link rate: everything of the user's cache but the all-reduce timing, which
    must be measured on the link the run has (a real cluster has one network; here it changes run to run)."""
    from corecpu import envvars

    base, target = envvars.cache_dir(), work / f"cache-{label}"
    if not target.exists():
        target.mkdir(parents=True)
        for entry in base.iterdir() if base.exists() else []:
            if entry.name != "allreduce.json":
                (target / entry.name).symlink_to(entry)
    return target


def _env(h: TwoHosts, extra: dict[str, str | None]) -> dict[str, str]:
    venv = str(Path(sys.executable).parent.parent)
    return h.full_env({"VIRTUAL_ENV": venv, "MASTER_ADDR": None, "MASTER_PORT": None, "OMP_NUM_THREADS": None,
                       "MKL_NUM_THREADS": None, "KMP_AFFINITY": None, **extra})


def variant_flags(variant: str, extra: dict[str, str]) -> list[str]:
    """Pure. train.py flags of a corecpu variant: none for `corecpu`, --corecpu-args' for a named one, else
    `corecpu:PATH` = --allreduce PATH."""
    name = variant.partition(":")[2]
    if not name:
        return []
    return harness.extra_args(extra[name])[1] if name in extra else ["--allreduce", name]


def run_corecpu(h: TwoHosts, flags: list[str], noop: bool, model: str, args: argparse.Namespace, out: Path,
                cache: Path, log: Path) -> dict[str, Any]:
    script = [str(BENCH / "noop_allreduce.py"), str(ROOT / "train.py")] if noop else []
    # Compute-only: the embedding's rows would otherwise still cross the network beside DDP.
    sparse_off = ["--sparse-embedding-allreduce", "off"] if noop else []
    cmd = ["bash", str(ROOT / "launch.sh"), str(len(h.namespaces)), "-f", str(h.hostfile), *script,
           *train_args(args, model, out), *flags, *sparse_off]
    with log.open("w") as fh:
        r = subprocess.run(h.cmd_in(h.namespaces[0], cmd), env=_env(h, {"CORECPU_CACHE_DIR": str(cache)}), cwd=ROOT,
                           stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=args.timeout)
    if r.returncode != 0:
        raise RuntimeError(f"corecpu run failed ({r.returncode}); see {log}:\n" + _tail(log))
    steps, evals = harness.corecpu_records((out / "metrics.jsonl").read_text().splitlines())
    resolved = json.loads((out / "config.json").read_text()).get("resolved", {})
    return {"steps": steps, "evals": evals, "allreduce": resolved.get("allreduce"),
            "allreduce_reason": resolved.get("allreduce_reason"),
            "sparse_embedding": resolved.get("sparse_embedding_allreduce"), "command": cmd}


def run_trainer(h: TwoHosts, noop: bool, model: str, args: argparse.Namespace, out_json: Path,
                log: Path) -> dict[str, Any]:
    n = len(h.namespaces)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    script = [str(BENCH / "noop_allreduce.py")] if noop else []
    env = _env(h, {"OMP_NUM_THREADS": str(args.cores_per_host), "GLOO_SOCKET_IFNAME": h.iface})
    procs = []
    with log.open("w") as fh:
        for i, ns in enumerate(h.namespaces):
            cmd = [torchrun, "--nnodes", str(n), "--node-rank", str(i), "--nproc-per-node", "1",
                   "--master-addr", h.addresses[0], "--master-port", str(PORT), *script,
                   str(BENCH / "hf_trainer.py"), *trainer_args(args, model, out_json)]
            procs.append(subprocess.Popen(h.cmd_in(ns, cmd), env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + args.timeout
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    if any(codes):
        raise RuntimeError(f"Trainer run failed ({codes}); see {log}:\n" + _tail(log))
    recorded = json.loads(out_json.read_text())
    return {"steps": recorded["steps"], "evals": recorded["evals"], "allreduce": "gloo (DDP)", "command": cmd}


def _tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def probe_link(h: TwoHosts) -> dict[str, float]:
    """TCP throughput host 0 -> host 1 for 2 s and the median round trip of a 1-byte ping-pong."""
    server = subprocess.Popen(h.cmd_in(h.namespaces[1], [sys.executable, str(LINK_PROBE), "serve", h.addresses[1]]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        port = server.stdout.readline().strip()
        r = subprocess.run(h.cmd_in(h.namespaces[0], [sys.executable, str(LINK_PROBE), "probe", h.addresses[1], port]),
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"link probe failed: {r.stderr[-2000:]}")
        return json.loads(r.stdout)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
        if server.poll() is None:
            server.kill()


@contextlib.contextmanager
def cluster(n: int, args: argparse.Namespace) -> Iterator[tuple[TwoHosts, list[str]]]:
    cpus = host_cpus(n, sorted(os.sched_getaffinity(0)), args.cores_per_host)
    with fake_hosts(n, switch=True, cpus=cpus, skip=False) as h:
        yield h, cpus


def one_run(h: TwoHosts, variant: str, noop: bool, model: str, args: argparse.Namespace, run_dir: Path,
            cache: Path) -> dict[str, Any]:
    name = variant.replace(":", "-") + ("-noop" if noop else "")
    log = run_dir / f"{name}.log"
    start = time.perf_counter()
    if variant == "trainer":
        got = run_trainer(h, noop, model, args, run_dir / f"{name}.json", log)
    else:
        got = run_corecpu(h, variant_flags(variant, args.corecpu_extra), noop, model, args, run_dir / name, cache, log)
    window = stats.timed_window(got["steps"], args.warmup, [e["step"] for e in got["evals"]])
    return {"variant": variant, "noop": noop, "wall_s": time.perf_counter() - start, **window,
            "allreduce": got.get("allreduce"), "allreduce_reason": got.get("allreduce_reason"),
            "sparse_embedding": got.get("sparse_embedding", "off"),
            "final_loss": got["steps"][-1]["loss"], "log": str(log), "command": got["command"],
            "step_times": [b["t"] - a["t"] for a, b in zip(got["steps"], got["steps"][1:])]}


def measure(args: argparse.Namespace, model: str, work: Path) -> list[dict[str, Any]]:
    """Every host count: the link probe per rate, then per repeat the compute-only run and the run at each rate
    of every variant (rates outer, variants inner, so a variant's runs are spread over the session; the order
    of the rates rotates from repeat to repeat)."""
    raw: list[dict[str, Any]] = []
    for n in args.host_counts:
        with cluster(n, args) as (h, cpus):
            print(f"== {n} hosts, CPU sets {cpus}", flush=True)
            links = {}
            for gbit in args.rates:
                shape(h, gbit * 1000 if gbit else None)
                links[gbit] = probe_link(h)
                print(f"   link {gbit or 'unshaped'} Gb/s: {links[gbit]}", flush=True)
            labels: list[float | None] = [None, *args.rates]  # None: the compute-only reference (link unshaped)
            for rep in range(1, args.repeats + 1):
                shift = (rep - 1) % len(labels)  # each repeat starts elsewhere: no link always runs first
                for gbit in labels[shift:] + labels[:shift]:
                    label = "noop" if gbit is None else f"{gbit:g}g"
                    shape(h, gbit * 1000 if gbit else None)
                    run_dir = work / f"h{n}" / f"r{rep}" / label
                    run_dir.mkdir(parents=True, exist_ok=True)
                    cache = rate_cache(work, f"h{n}-{label}")
                    for v in args.variant_list:
                        r = one_run(h, v, gbit is None, model, args, run_dir, cache)
                        r.update(hosts=n, cpus=cpus, gbit=gbit, repeat=rep, link=links.get(gbit))
                        raw.append(r)
                        print(f"   {label:>5} {v:<14} {r['ms_per_step']:8.0f} ms/step  ({r['allreduce']})", flush=True)
            shape(h, None)
    return raw


def summarize(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over repeats per (hosts, variant, rate), each with its compute-only reference's median."""
    rows = []
    keys = sorted({(r["hosts"], r["variant"]) for r in raw})
    for n, v in keys:
        mine = [r for r in raw if r["hosts"] == n and r["variant"] == v]
        compute = statistics.median(r["ms_per_step"] for r in mine if r["noop"])
        for gbit in sorted({r["gbit"] for r in mine if not r["noop"]}):
            runs = [r for r in mine if r["gbit"] == gbit and not r["noop"]]
            step = statistics.median(r["ms_per_step"] for r in runs)
            rows.append({"hosts": n, "variant": v, "gbit": gbit, "compute_ms": compute, "step_ms": step,
                         **efficiency(compute, step), "allreduce": runs[0]["allreduce"], "link": runs[0]["link"],
                         "sparse_embedding": runs[0].get("sparse_embedding", "off"),
                         "repeats": len(runs)})
    return rows


def paired(raw_by_file: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Pure. Each repeat's efficiency against the compute-only run of the same repeat (same file, variant, hosts),
    pooled over files, with the median: the compute-only time drifts between repeats by as much as the
    network costs (up to 10% on 4 hosts), so a repeat is compared with its own reference."""
    runs: dict[tuple[int, str, float], list[float]] = {}
    for raw in raw_by_file:
        noop = {(r["hosts"], r["variant"], r["repeat"]): r["ms_per_step"] for r in raw if r["noop"]}
        for r in raw:
            ref = noop.get((r["hosts"], r["variant"], r["repeat"]))
            if not r["noop"] and ref:
                runs.setdefault((r["hosts"], r["variant"], r["gbit"]), []).append(ref / r["ms_per_step"])
    return [{"hosts": n, "variant": v, "gbit": g, "efficiencies": sorted(e), "median": statistics.median(e)}
            for (n, v, g), e in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1]))]


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| hosts | link | variant (path) | compute-only ms | step ms | exposed comm ms | efficiency |",
           "|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        link = f"{r['gbit']:g} Gb/s" if r["gbit"] else "unshaped"
        measured = r["link"] or {}
        if measured:
            link += f" ({measured['gbit_s']:.2f} measured, RTT {measured['rtt_us']:.0f} us)"
        path = r["allreduce"] + (", sparse rows" if r.get("sparse_embedding") == "on" else "")
        out.append(f"| {r['hosts']} | {link} | {r['variant']} ({path}) | {r['compute_ms']:.0f} | "
                   f"{r['step_ms']:.0f} | {r['exposed_comm_ms']:.0f} | {100 * r['efficiency']:.0f}% |")
    return "\n".join(out)


def plot(files: list[Path], out: Path) -> Path:
    """Efficiency against the link's measured rate, a panel per result file, a line per variant; the scale
    model's prediction for the same runs dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import scale_model

    cols = min(3, len(files))
    fig, axes = plt.subplots(-(-len(files) // cols), cols, figsize=(5 * cols, 4 * -(-len(files) // cols)),
                             squeeze=False)
    for ax in axes.flat[len(files):]:
        ax.set_visible(False)
    for ax, path in zip(axes.flat, files):
        result = json.loads(path.read_text())
        predicted = {(r["variant"], r["gbit"]): r["predicted"] for r in scale_model.check(result, 0.6)}
        for v in dict.fromkeys(r["variant"] for r in result["rows"]):
            rows = sorted((r for r in result["rows"] if r["variant"] == v), key=lambda r: r["link"]["gbit_s"])
            x = [r["link"]["gbit_s"] for r in rows]
            line, = ax.plot(x, [100 * r["efficiency"] for r in rows], "o-", label=v)
            ax.plot(x, [100 * predicted[(v, r["gbit"])] for r in rows], "x--", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log")
        ax.set_xlim(0.7, 20)  # every panel on the same axis: 1, 10 and 25 Gb/s links (25 carries 9-15 here)
        ax.set_xlabel("link, measured Gb/s")
        ax.set_ylabel("scaling efficiency, %")
        ax.set_ylim(40, 110)
        ax.axhline(85, color="grey", lw=0.5)
        cpu = "Xeon" if "Xeon" in result["machine"]["cpu_model"] else result["machine"]["cpu_model"]
        ax.set_title(f"{result['config']['model']}, {result['rows'][0]['hosts']} hosts, {cpu}")
        ax.legend(fontsize=8, title="solid: measured, dashed: model", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:
        print(markdown(json.loads(args.report.read_text())["rows"]))
        return
    if args.pool:
        print("| hosts | link Gb/s | variant | repeats | efficiency, median (each repeat) |\n|---:|---:|---|---:|---|")
        for r in paired([json.loads(f.read_text())["raw"] for f in args.pool]):
            each = ", ".join(f"{100 * e:.0f}" for e in r["efficiencies"])
            print(f"| {r['hosts']} | {r['gbit']:g} | {r['variant']} | {len(r['efficiencies'])} | "
                  f"{100 * r['median']:.0f}% ({each}) |")
        return
    if args.plot:
        print(f"written to {plot(args.plot, args.out or BENCH / 'results' / 'cluster-efficiency.png')}")
        return
    if shutil.which("tc") is None:
        raise SystemExit("cluster.py: error: `tc` (iproute2) is needed to shape the links; apt-get install iproute2")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="corecpu-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    model = {"minilm": "default", "tiny": "tiny"}.get(args.model) or (
        str(bert_base_random(work)) if args.model == "bert-base" else args.model)
    print(f"cluster benchmark: {args.model}, hosts {args.host_counts}, links {args.rates} Gb/s, variants "
          f"{args.variant_list}; outputs in {work}", flush=True)
    args.files = write_data(args.data, args.eval_rows, work)
    raw = measure(args, model, work)
    rows = summarize(raw)
    from throughput import machine

    result = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "work_dir", "report", "files")},
              "machine": machine(), "rows": rows, "raw": raw,
              "method": "efficiency = compute-only step / step; compute-only = the same launch with DDP's gradient "
                        "all-reduce a no-op (benchmarks/noop_allreduce.py); step = mean interval of steps W+1..S "
                        "(rank 0's timestamps); medians over repeats"}
    out = args.out or BENCH / "results" / f"cluster-{Path(args.model).name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(markdown(rows))
    print(f"written to {out}")
    if args.work_dir is None:  # everything read from it is in the JSON; a failed run raised above and keeps it
        shutil.rmtree(work, ignore_errors=True)
        print(f"removed {work} (run outputs and logs, several GB); --work-dir DIR keeps them")


if __name__ == "__main__":
    main()
