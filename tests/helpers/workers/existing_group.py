"""One rank of a Ray Train worker's start, without Ray (run by tests/multiprocess/test_front_door.py): RAY_RAYLET_PID and
torchrun's variables in the environment, the gloo process group made before corecpu.setup() (Ray's torch backend
does both), Ray's OMP_NUM_THREADS=1, and torch's threads already running (Ray's are). setup() must use that group,
refuse another backend in one line, bind every thread to this rank's CPUs, and leave the group open at close."""

import gc
import json
import os
import sys
import threading

os.environ["RAY_RAYLET_PID"] = str(os.getppid())  # what marks a process a Ray node started
import corecpu  # noqa: E402,I001  (first: records the launcher's CPUs)
import torch.distributed as dist  # noqa: E402

out_path = sys.argv[1]
dist.init_process_group("gloo", init_method="env://", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
made = dist.group.WORLD
stop = threading.Event()
launchers_thread = threading.Thread(target=stop.wait, daemon=True)  # one of the launcher's threads, before setup()
launchers_thread.start()
try:
    corecpu.setup(backend="mpi", dist_timeout=30)
    refused = ""
except corecpu.CoreCPUError as exc:
    refused = str(exc)
with corecpu.setup(precision="fp32", allreduce="gloo", dist_timeout=30) as run:
    total = run.all_reduce_sum([1.0])
    report = {"rank": run.rank, "launcher": run.launch.launcher, "describe": run.describe(), "total": total,
              "cpus": list(run.cpus), "threads": run.threads, "omp": os.environ["OMP_NUM_THREADS"],
              "launchers_thread_cpus": sorted(os.sched_getaffinity(launchers_thread.native_id)),
              "refused": refused}
    everyone = run.gather(report)
kept = dist.is_initialized() and dist.group.WORLD is made
dist.all_reduce(__import__("torch").ones(1))  # still usable after close: its maker's to destroy
dist.destroy_process_group()
# Let the group (and rank 0's store in it) go now: freed at interpreter shutdown, its C++ threads abort the exit.
del made, run
gc.collect()
stop.set()
if everyone[0]["rank"] == int(os.environ["RANK"]) == 0:
    json.dump({"ranks": everyone, "kept": kept}, open(out_path, "w"))
