#!/usr/bin/env python3
"""A stand-in for Slurm's `srun` inside a batch job, for tests: starts the step's tasks
locally with the variables real srun gives each task.

    srun [--ntasks N] [--nodes N] [--ntasks-per-node N] [--cpus-per-task N] [--nodelist LIST]
         [--cpu-bind TYPE] [--kill-on-bad-exit[=1]] [--input none] CMD ARGS...

Layout is Slurm's default block distribution over the allocation's nodes
(SLURM_JOB_NODELIST, expanded with python-hostlist as scontrol does). With
FAKE_SRUN_NODE_EXEC set, a task of node H runs as `$FAKE_SRUN_NODE_EXEC H CMD...`
(e.g. tests/helpers/netns.py's bootstrap script, one network namespace per node), the way
slurmd would start it on that node; otherwise every task runs here. It binds nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import time

import hostlist


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="srun (fake)", allow_abbrev=False)
    p.add_argument("-n", "--ntasks", type=int)
    p.add_argument("-N", "--nodes", type=int)
    p.add_argument("--ntasks-per-node", type=int)
    p.add_argument("-c", "--cpus-per-task", type=int)
    p.add_argument("-w", "--nodelist", help="run on these nodes of the allocation (Intel MPI's hydra passes it)")
    p.add_argument("--input", "-i")
    p.add_argument("--cpu-bind", "--cpu_bind", default="")
    p.add_argument("-K", "--kill-on-bad-exit", nargs="?", const="1", default="0")
    p.add_argument("--mpi", "--export", "--label", "-l", "--unbuffered", "-u", dest="ignored", nargs="?", const="")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if not args.command:
        p.error("no command")
    return args


def layout(args: argparse.Namespace, env: dict[str, str]) -> list[tuple[str, int]]:
    """(node, local id) of each task, in rank order (block distribution)."""
    nodes = hostlist.expand_hostlist(args.nodelist or env["SLURM_JOB_NODELIST"])
    nnodes = args.nodes or (len(nodes) if args.nodelist else int(env.get("SLURM_NNODES", len(nodes))))
    nodes = nodes[:nnodes]
    per_node = args.ntasks_per_node or int(env.get("SLURM_NTASKS_PER_NODE", "0") or 0)
    ntasks = args.ntasks or (per_node * nnodes if per_node else int(env.get("SLURM_NTASKS", nnodes)))
    per_node = per_node or -(-ntasks // nnodes)
    return [(nodes[i // per_node], i % per_node) for i in range(ntasks)]


def main(argv: list[str]) -> int:
    args = parse(argv)
    env = dict(os.environ)
    tasks = layout(args, env)
    nodes = list(dict.fromkeys(node for node, _ in tasks))
    counts = [sum(1 for n, _ in tasks if n == node) for node in nodes]
    # Slurm's compressed count list: "2(x3),1"
    spec = ",".join(f"{c}(x{n})" if n > 1 else f"{c}" for c, n in ((c, len(list(g))) for c, g in itertools.groupby(counts)))
    bind = args.cpu_bind.split(",")[-1] if args.cpu_bind else "none"
    step = {
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_NTASKS": str(len(tasks)), "SLURM_NPROCS": str(len(tasks)),
        "SLURM_STEP_NUM_TASKS": str(len(tasks)), "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_STEP_NODELIST": hostlist.collect_hostlist(nodes), "SLURM_STEP_TASKS_PER_NODE": spec,
        "SLURM_TASKS_PER_NODE": spec, "SLURM_NNODES": str(len(nodes)),
        "SLURM_CPU_BIND_TYPE": "none" if bind == "none" else "mask_cpu:", "SLURM_CPU_BIND": args.cpu_bind or "none",
    }
    if args.cpus_per_task:
        step["SLURM_CPUS_PER_TASK"] = str(args.cpus_per_task)
    node_exec = env.get("FAKE_SRUN_NODE_EXEC")
    procs = []
    for rank, (node, local) in enumerate(tasks):
        task_env = {**env, **step, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
                    "SLURM_NODEID": str(nodes.index(node)), "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node}
        cmd = [node_exec, node, *args.command] if node_exec else list(args.command)
        procs.append(subprocess.Popen(cmd, env=task_env, stdin=subprocess.DEVNULL, start_new_session=True))
    kill_on_bad_exit = args.kill_on_bad_exit not in ("0", "")
    rcs: list[int | None] = [None] * len(procs)
    while any(rc is None for rc in rcs):
        for i, p in enumerate(procs):
            if rcs[i] is None:
                rcs[i] = p.poll()
        if kill_on_bad_exit and any(rc not in (None, 0) for rc in rcs):
            for i, p in enumerate(procs):
                if rcs[i] is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    rcs[i] = p.wait()
        time.sleep(0.1)
    return max((abs(rc) for rc in rcs if rc), default=0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
