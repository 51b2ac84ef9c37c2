"""What data parallelism costs on a network, predicted: a model of DDP's bucketed all-reduce, checked against
benchmarks/cluster.py's runs and extrapolated to clusters this machine cannot hold.

    python benchmarks/scale_model.py --check benchmarks/results/cluster-minilm.json   # predicted vs measured
    python benchmarks/scale_model.py --predict                                       # 8..64 nodes, 25/100 Gb/s

The model (pure functions below, tested in tests/unit/test_scale_model.py):
- The gradient is cut into DDP's buckets as DDP rebuilds them after the first step: parameters in the order
  backward makes their gradients (about the reverse of the model's), a bucket closed once it reaches its cap
  (1 MiB for the first, 25 MiB after), so a bucket can end well past the cap: MiniLM's last holds its last
  layers and the 45 MiB word embedding, 57 MiB in all. With the sparse embedding all-reduce the word
  embedding's bucket carries only the rows the step touched.
- A bucket's all-reduce over N hosts is a ring: 2(N-1) steps, each a latency `alpha` plus S/N bytes at the
  link's bandwidth. With ranks_per_node > 1 the hierarchical path reduces inside the node first (shared
  memory, taken as free beside the wire), so the ring runs over nodes.
- Overlap: backward makes the buckets ready one after another (at times proportional to the work behind
  them: a transformer layer's backward work is about proportional to its weights, an embedding table's is
  next to nothing, a scatter of the batch's rows; counting the word embedding's 52% of MiniLM's parameters
  as 52% of backward had the other buckets ready far too early), the network
  sends them in order, one at a time, and the step ends when the last one is done or compute is, whichever
  is later. Backward is `backward_share` of the compute-only step (measured by benchmarks/phases.py; the
  forward pass and the optimizer come before and after and hide nothing). The embedding's gradient is
  backward's last: its bucket is never hidden.
- exposed = finish of the last all-reduce - end of backward (at least 0); step = compute-only step + exposed
  + the network stack's CPU time where it shares the compute cores (--check: the fake hosts have one core
  each, and the TCP copies of every byte sent and received run there; charged at the CPU-bound rate of the
  fastest link probe, once for each host whose CPU set is that core: 4 fake hosts on 2 cores pay twice,
  as their compute-only step already pays twice for compute); efficiency = compute-only step / step.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

FIRST_BUCKET, BUCKET = 2**20, 25 * 2**20  # DDP's defaults (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, 25 MB)
VOCAB = 30522  # MiniLM's and BERT-base's word embedding rows
# Rows of the word embedding one rank's batch touches (MiniLM's tokenizer, `paraphrase`, 16 pairs a batch: mean 191,
# counted by benchmarks/sparse_rows_count.py); the sparse all-reduce sends the union over the ranks.
SPARSE_ROWS_PER_RANK = 191


@dataclass(frozen=True)
class Link:
    gbit_s: float       # usable bandwidth each way
    alpha_s: float      # per ring step: one message's latency and software cost
    cpu_s_per_byte: float = 0.0  # the network stack's CPU per byte sent or received, where it runs on a core that
    #                              also computes (here: 1 / the CPU-bound TCP throughput of one stream); 0 where
    #                              a spare core or the NIC carries it
    hosts_per_core: int = 1      # hosts whose stack work lands on one core (the fake hosts, when they outnumber
    #                              the cores): the hosts step together, so a core's stack work is that many hosts'


@dataclass(frozen=True)
class Job:
    compute_s: float                # compute-only step
    param_sizes: tuple[int, ...]    # numel in the model's parameter order (as named_parameters gives them)
    bytes_per_value: int = 4        # fp32 on the wire; 2 for bf16
    backward_share: float = 0.6     # of compute_s
    embedding_rows: tuple[int, int] | None = None  # (rows touched per step, row width) when sent sparse;
    #                                                the word embedding is the first parameter
    param_work: tuple[float, ...] | None = None  # backward work behind each parameter (None: its size); a lookup
    #                                              table's gradient is a scatter of the batch's rows, next to free


def buckets(job: Job, hosts: int) -> list[tuple[int, float]]:
    """Pure. DDP's buckets in the order backward fills them: (bytes, fraction of backward done when ready).
    A sparse word embedding is not in DDP's buckets: its touched rows go last, on their own, and the rows of
    `hosts` nodes are the union of theirs (taken as disjoint, the pessimistic case, up to the vocabulary)."""
    sizes = list(job.param_sizes)
    work = job.param_work or job.param_sizes
    total = float(sum(work)) or 1.0
    last: list[tuple[int, float]] = []
    if job.embedding_rows is not None:
        rows, width = job.embedding_rows
        union = min(sizes[0] // width, rows * hosts)
        last, sizes[0] = [(union * width * job.bytes_per_value, 1.0)], 0
    # Buckets are cut by the parameters' own bytes (fp32); a bf16 wire halves what each one sends.
    out: list[tuple[int, float]] = []
    current, cap, done = 0, FIRST_BUCKET, 0.0
    for i in reversed(range(len(sizes))):
        done += work[i] / total
        if not sizes[i]:
            continue
        current += sizes[i] * 4
        if current >= cap:  # as torch's _compute_bucket_assignment_by_size: add, then close at the cap
            out.append((current * job.bytes_per_value // 4, done))
            current, cap = 0, BUCKET
    if current:
        out.append((current * job.bytes_per_value // 4, done))
    return out + last


def ring_s(nbytes: float, hosts: int, link: Link) -> float:
    """Pure. One ring all-reduce of nbytes over `hosts` (reduce-scatter + all-gather)."""
    if hosts < 2:
        return 0.0
    return 2 * (hosts - 1) * (link.alpha_s + nbytes / hosts / (link.gbit_s * 1e9 / 8))


def step(job: Job, hosts: int, link: Link) -> dict[str, float]:
    """Pure. Predicted step, exposed communication and efficiency of `job` on `hosts` nodes over `link`."""
    backward = job.backward_share * job.compute_s
    start_of_backward = (1 - job.backward_share) * job.compute_s * 0.5  # forward before it (optimizer after)
    net_free, total_comm = 0.0, 0.0
    for nbytes, ready in buckets(job, hosts):
        t = ring_s(nbytes, hosts, link)
        total_comm += t
        net_free = max(net_free, start_of_backward + ready * backward) + t
    end_of_backward = start_of_backward + backward
    exposed = max(0.0, net_free - end_of_backward)
    # A ring host sends and receives 2(N-1)/N of every bucket; where that costs compute cores, it adds to the step.
    moved = 2 * 2 * (hosts - 1) / hosts * sum(b for b, _ in buckets(job, hosts)) if hosts > 1 else 0.0
    stack = moved * link.cpu_s_per_byte * link.hosts_per_core
    total = job.compute_s + stack + exposed
    return {"step_s": total, "exposed_s": exposed + stack, "stack_cpu_s": stack, "allreduce_s": total_comm,
            "efficiency": job.compute_s / total}


# ---------------------------------------------------------------- checking against measured runs

def model_sizes(spec: str) -> tuple[int, ...]:
    """Parameter sizes of a benchmarked model: minilm, bert-base, tiny (built from their configs, not trained)."""
    return tuple(n for n, _ in model_params(spec))


def model_work(spec: str) -> tuple[float, ...]:
    """Backward work behind each parameter of model_sizes(spec): its size, 0 for an embedding table's."""
    return tuple(0.0 if table else float(n) for n, table in model_params(spec))


@functools.lru_cache(maxsize=None)
def model_params(spec: str) -> tuple[tuple[int, bool], ...]:
    """(numel, is an nn.Embedding's) for each parameter of a benchmarked model, in parameter order."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig

    from corecpu.training.modeling import default_model_dir, tiny_config

    if spec == "minilm":
        config = AutoConfig.from_pretrained(default_model_dir(), num_labels=2)
    elif spec == "bert-base":
        config = BertConfig(vocab_size=30522, num_labels=2)
    elif spec == "tiny":
        config = tiny_config(30522, 2)
    else:
        config = AutoConfig.from_pretrained(spec, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return tuple((p.numel(), id(p) in tables) for p in model.parameters())


def hosts_per_core(result: dict, hosts: int) -> int:
    """Pure. The most fake hosts that shared one CPU set in the runs of `hosts` hosts (cluster.py's raw runs)."""
    sets = next((r["cpus"] for r in result.get("raw", ()) if r.get("hosts") == hosts and r.get("cpus")), None)
    return max(Counter(sets).values()) if sets else 1


def wire_bytes(result: dict, variant: str) -> int:
    """Pure. Bytes per gradient value on the wire in a variant's runs: 2 where it ran with --allreduce-dtype bf16."""
    command = next((r.get("command", []) for r in result.get("raw", ()) if r.get("variant") == variant and
                    not r.get("noop")), [])
    pairs = zip(command, command[1:])
    return 2 if ("--allreduce-dtype", "bf16") in pairs else 4


def check(result: dict, backward_share: float, cpu_per_byte: float = 1.0) -> list[dict[str, float | str]]:
    """Each measured (hosts, variant, link) row against the model fed its compute-only time and measured link.
    `cpu_per_byte` scales the stack's cost (0: leave it out)."""
    sizes, work = model_sizes(result["config"]["model"]), model_work(result["config"]["model"])
    rows = []
    for r in result["rows"]:
        if not r.get("link"):
            continue
        # The fastest probe of that cluster is CPU-bound (the shaper let more through): its rate is the stack's cost.
        peak = max(x["link"]["gbit_s"] for x in result["rows"] if x["hosts"] == r["hosts"] and x.get("link"))
        link = Link(gbit_s=min(r["link"]["gbit_s"], r["gbit"] or math.inf), alpha_s=r["link"]["rtt_us"] * 1e-6,
                    cpu_s_per_byte=cpu_per_byte * 8 / (peak * 1e9), hosts_per_core=hosts_per_core(result, r["hosts"]))
        sparse = r.get("sparse_embedding") == "on"
        job = Job(compute_s=r["compute_ms"] / 1e3, param_sizes=sizes, param_work=work, backward_share=backward_share,
                  bytes_per_value=wire_bytes(result, r["variant"]),
                  embedding_rows=(SPARSE_ROWS_PER_RANK, sizes[0] // VOCAB) if sparse else None)
        got = step(job, r["hosts"], link)
        rows.append({"hosts": r["hosts"], "variant": r["variant"], "gbit": r["gbit"], "measured": r["efficiency"],
                     "predicted": got["efficiency"], "error": got["efficiency"] / r["efficiency"] - 1})
    return rows


# ---------------------------------------------------------------- beyond this machine

# Per-node compute of a 2-socket Xeon, from the 16-core AMX node of issue 29 (1 rank x 16 threads, bf16):
# MiniLM 106 samples/s, BERT-base 30.4 samples/s, scaled by cores (an assumption: the per-core rate holds).
NODE_CORES, MEASURED_CORES = 112, 16   # e.g. 2 x 56-core Sapphire Rapids
PER_NODE_BATCH = 64
MEASURED_RATE = {"minilm": 106.0, "bert-base": 30.4}


def predict_table(sizes: dict[str, tuple[int, ...]], work: dict[str, tuple[float, ...]] | None = None,
                  nodes: Sequence[int] = (2, 4, 8, 16, 32, 64),
                  gbits: Sequence[float] = (25, 100), alpha_us: float = 15.0, usable: float = 0.8,
                  backward_share: float = 0.6) -> list[dict[str, float | str]]:
    rows = []
    for model, params in sizes.items():
        compute = PER_NODE_BATCH / (MEASURED_RATE[model] * NODE_CORES / MEASURED_CORES)
        for gbit in gbits:
            for sparse in (False, True):
                for wire in (4, 2):
                    job = Job(compute_s=compute, param_sizes=params, bytes_per_value=wire,
                              backward_share=backward_share, param_work=(work or {}).get(model),
                              embedding_rows=(PER_NODE_BATCH * 40, params[0] // VOCAB) if sparse else None)
                    for n in nodes:
                        got = step(job, n, Link(gbit_s=gbit * usable, alpha_s=alpha_us * 1e-6))
                        rows.append({"model": model, "gbit": gbit, "sparse": sparse, "wire": "fp32" if wire == 4
                                     else "bf16", "nodes": n, "compute_ms": 1e3 * compute,
                                     "step_ms": 1e3 * got["step_s"], "efficiency": got["efficiency"]})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", type=Path, action="append", default=[], help="a cluster.py result file")
    p.add_argument("--predict", action="store_true")
    p.add_argument("--backward-share", type=float, default=0.6)
    p.add_argument("--no-stack-cpu", action="store_true", help="--check without the network stack's CPU cost")
    args = p.parse_args(argv)
    for path in args.check:
        print(f"{path}: measured vs predicted efficiency")
        print("| hosts | link Gb/s | variant | measured | predicted | error |\n|---:|---:|---|---:|---:|---:|")
        for r in check(json.loads(path.read_text()), args.backward_share, 0.0 if args.no_stack_cpu else 1.0):
            print(f"| {r['hosts']} | {r['gbit']:g} | {r['variant']} | {100 * r['measured']:.0f}% | "
                  f"{100 * r['predicted']:.0f}% | {100 * r['error']:+.0f}% |")
    if args.predict:
        sizes = {m: model_sizes(m) for m in MEASURED_RATE}
        print("| model | Gb/s | embedding | wire | " + " | ".join(f"{n} nodes" for n in (2, 4, 8, 16, 32, 64)) + " |")
        print("|---|---:|---|---|" + "---:|" * 6)
        rows = predict_table(sizes, {m: model_work(m) for m in MEASURED_RATE})
        for i in range(0, len(rows), 6):
            group = rows[i:i + 6]
            g = group[0]
            print(f"| {g['model']} | {g['gbit']:g} | {'sparse' if g['sparse'] else 'dense'} | {g['wire']} | "
                  + " | ".join(f"{100 * r['efficiency']:.0f}%" for r in group) + " |")


if __name__ == "__main__":
    main()
