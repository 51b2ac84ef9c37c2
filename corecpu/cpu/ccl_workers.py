"""The oneCCL part of a node's plan: where its worker threads run, or that none runs, and its transport.

Pure. oneCCL progresses collectives in worker threads that poll; `CCL_WORKER_AFFINITY` lists one CPU per
worker per local rank (rank 0's first). A rank with a core to spare gets a worker on it (placement.py reserves
it); a rank without one runs its collectives in its own thread (`CCL_WORKER_OFFLOAD=0`), because a polling
worker on the compute core starves the compute: issue 15 reports, from the 2-vCPU dev machine (2 ranks,
torchrun), a 1 MB all-reduce in 36 ms with oneCCL's defaults and 0.36-0.41 ms with CCL_WORKER_OFFLOAD=0,
and 32 MB in 11-26 ms with CCL_ATL_SHM=1 as well (gloo: 26-59 ms). corecpu's own comparison
(benchmarks/allreduce.py --ccl-settings all, same machine, medians of 3, 1 / 32 / 128 MB): oneCCL's defaults
5.61 / 65.8 / 286 ms; offload 0 + OFI 1.48 / 27.9 / 124; offload 0 + OFI + ATL shm (this plan) 0.99 / 10.4 /
50.6; offload 0 + the MPI transport 0.80 / 12.8 / 62.2; gloo 2.5-4.0 / 39-49 / 139-151.
"""

from __future__ import annotations

from typing import Sequence

# ofi works under every launcher corecpu supports (mpi needs ranks started by an MPI launcher; it did
# all-reduce correctly under mpirun here), and CCL_ATL_SHM=1 moves intra-node messages through shared
# memory instead of the tcp provider: the fastest setting from 32 MB up in the figures above (MPI's
# transport wins only at 1 MB, by 0.2 ms, where a step's buckets are not).
ATL_TRANSPORT = "ofi"
ATL_SHM = "1"


def ccl_environment(compute_cpus: Sequence[Sequence[int]], worker_cpus: Sequence[Sequence[int]]) -> dict[str, str]:
    """Pure: oneCCL's variables for the local ranks, given each rank's compute CPUs and reserved worker CPUs
    (all ranks reserve the same number, possibly none)."""
    env = {"CCL_ATL_TRANSPORT": ATL_TRANSPORT, "CCL_ATL_SHM": ATL_SHM}
    workers = len(worker_cpus[0]) if worker_cpus else 0
    if workers:
        env["CCL_WORKER_COUNT"] = str(workers)
        env["CCL_WORKER_AFFINITY"] = ",".join(str(c) for cpus in worker_cpus for c in cpus)
    else:
        # No core to spare: run collectives in the rank's thread. oneCCL still starts one (idle) worker;
        # keep it on the rank's own first CPU rather than wherever the scheduler puts it.
        env["CCL_WORKER_OFFLOAD"] = "0"
        env["CCL_WORKER_COUNT"] = "1"
        env["CCL_WORKER_AFFINITY"] = ",".join(str(cpus[0]) for cpus in compute_cpus)
    return env
