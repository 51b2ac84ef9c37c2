"""Real multi-host launches: Intel MPI's mpirun over two network-namespace "hosts".

See tests/helpers/netns.py for how the hosts are built. mpirun runs inside the first
namespace; hydra starts the second host's proxy through the fixture's bootstrap-exec
script. The launched programs do not call MPI_Init: they read the PMI_* /
MPI_LOCAL* variables hydra sets and join a torch.distributed gloo group.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.chaoslib import TINY, Job, descendants, kill_all, listening, rank_pids, survivors, wait_for_step
from helpers.common import ROOT
from helpers.netns import find_mpirun, two_hosts

MPIRUN_TIMEOUT = 180  # seconds; the job itself takes ~3 s

ALLREDUCE = textwrap.dedent(
    """
    import json, os, socket, subprocess, sys
    import torch, torch.distributed as dist

    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    dist.init_process_group(
        "gloo", rank=rank, world_size=size,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    )
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    addrs = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", sys.argv[2]],
                           capture_output=True, text=True, timeout=10).stdout.split()
    res = {
        "rank": rank, "size": size,
        "local_rank": os.environ.get("MPI_LOCALRANKID"), "local_size": os.environ.get("MPI_LOCALNRANKS"),
        "hostname": socket.gethostname(),
        "netns": os.readlink("/proc/self/ns/net"),
        "addr": addrs[3].split("/")[0] if len(addrs) > 3 else None,
        "value": t.item(),
    }
    # a file per rank: hydra may interleave the ranks' stdout
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    print(json.dumps(res), flush=True)
    """
)


@pytest.fixture
def hosts():
    if find_mpirun() is None:
        pytest.skip("Intel MPI mpirun not found (pip install impi-rt)")
    with two_hosts() as h:
        yield h


@pytest.mark.parametrize(
    "hostfile_kind, gloo_ifname",
    [
        ("addresses", True),  # GLOO_SOCKET_IFNAME pins gloo to the veth
        ("hostnames", False),  # gloo resolves the (per-namespace) hostname to the veth address
    ],
)
def test_mpirun_gloo_allreduce_across_two_hosts(hosts, tmp_path, hostfile_kind, gloo_ifname):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    out = tmp_path / "out"
    out.mkdir()
    hostfile = hosts.hostfile if hostfile_kind == "addresses" else hosts.hostfile_names
    master = hostfile.read_text().split()[0]  # what launch.sh does: first host of the hostfile
    env: dict[str, str | None] = {"MASTER_ADDR": master, "MASTER_PORT": "29511", "OMP_NUM_THREADS": "1"}
    env["GLOO_SOCKET_IFNAME"] = hosts.iface if gloo_ifname else None  # None: unset
    cmd = [find_mpirun(), "-f", str(hostfile), "-n", "2", "-ppn", "1",
           sys.executable, str(script), str(out), hosts.iface]

    t0 = time.monotonic()
    r = hosts.run_in(hosts.namespaces[0], cmd, env=env, timeout=MPIRUN_TIMEOUT)
    elapsed = time.monotonic() - t0
    log = f"rc={r.returncode} after {elapsed:.1f}s\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    assert r.returncode == 0, log

    results = {}
    for rank in range(2):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote no result\n{log}"
        results[rank] = json.loads(path.read_text())

    r0, r1 = results[0], results[1]
    assert r0["size"] == r1["size"] == 2
    assert (r0["local_rank"], r0["local_size"]) == ("0", "1")
    assert (r1["local_rank"], r1["local_size"]) == ("0", "1")
    # each rank ran in its own network namespace, none in the test's, on "its" host
    assert r0["netns"] != r1["netns"], log
    assert os.readlink("/proc/self/ns/net") not in (r0["netns"], r1["netns"])
    assert (r0["addr"], r1["addr"]) == hosts.addresses, log  # rank 0 on the first host of the hostfile
    assert (r0["hostname"], r1["hostname"]) == hosts.hostnames
    # and gloo really connected them
    assert r0["value"] == r1["value"] == 3.0, log


def test_launch_sh_trains_across_two_hosts(tmp_path):
    """launch.sh with a hostfile: one rank per host, same final loss and weights on both.

    The hosts share this machine's hostname (which resolves to loopback), and no
    GLOO_SOCKET_IFNAME is set: train.py must find the interface that routes to
    MASTER_ADDR by itself, as it would on a real cluster with a badly resolving hostname.
    """
    if find_mpirun() is None:
        pytest.skip("Intel MPI mpirun not found (pip install impi-rt)")

    out = tmp_path / "run"
    with two_hosts(isolate_hostname=False) as h:
        env = {"VIRTUAL_ENV": str(os.path.dirname(os.path.dirname(sys.executable))), "GLOO_SOCKET_IFNAME": None,
               "MASTER_ADDR": None, "MASTER_PORT": None}
        cmd = ["bash", str(ROOT / "launch.sh"), "2", "-f", str(h.hostfile), "--model", "tiny", "--precision", "fp32",
               "--max-steps", "10", "--log-every", "5", "--progress", "off", "--output-dir", str(out)]
        r = h.run_in(h.namespaces[0], cmd, env=env, timeout=MPIRUN_TIMEOUT, cwd=ROOT)
    log = f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, log
    assert "2 rank(s) via intel-mpi" in r.stdout, log
    summary = json.loads((out / "summary.json").read_text())
    ranks = summary["ranks"]
    assert [v["rank"] for v in ranks] == [0, 1]
    assert summary["steps"] == 10 and ranks[0]["steps"] == ranks[1]["steps"] == 10
    assert ranks[0]["final_loss"] == ranks[1]["final_loss"] == summary["final_loss"]
    assert ranks[0]["param_checksum"] == ranks[1]["param_checksum"]
    # Each node planned its own binding: one rank per node gets all of that node's CPUs.
    topo = json.loads((out / "topology.json").read_text())["ranks"]
    assert all(t["binding"] == "bound by corecpu.bind" for t in topo), topo
    # ...and gloo found the veth on its own (the hostname would have led it to loopback).
    assert [t["gloo_socket_ifname"] for t in topo] == [h.iface, h.iface], topo


def test_two_host_job_listens_on_its_interface_and_a_remote_stopped_rank_ends_it(tmp_path):
    """Listeners: only loopback or the hosts' own veth address, in each host's namespace (hydra's proxies
    and the ranks included). Then SIGSTOP the rank on the second host: it is named in one line and the whole
    job ends, the stopped rank included. impi-rt 2021.18 ends a multi-host job itself when rank 0 exits 124
    (exit 255; measured with plain processes too); where hydra waits instead, the ranks' request makes
    `corecpu launch` kill what is left after its grace (exit 124; tests/unit/reliability/test_exits.py)."""
    if find_mpirun() is None:
        pytest.skip("Intel MPI mpirun not found (pip install impi-rt)")
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    with two_hosts() as h:
        env = h.full_env({"VIRTUAL_ENV": str(os.path.dirname(os.path.dirname(sys.executable))),
                          "MASTER_ADDR": None, "MASTER_PORT": None})
        # --allreduce gloo: no rank calls MPI_Init (hydra's own cleanup of MPI ranks is not what is tested).
        cmd = ["bash", str(ROOT / "launch.sh"), "2", "-f", str(h.hostfile), *TINY, "--max-steps", "100000",
               "--log-every", "1", "--batch-size", "8", "--step-timeout", "10", "--allreduce", "gloo",
               "--output-dir", str(out)]
        with open(log, "wb") as f:
            proc = subprocess.Popen(h.cmd_in(h.namespaces[0], cmd), env=env, cwd=ROOT, stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        job = Job(proc, out, log)
        try:
            wait_for_step(job, 3)
            found = listening(descendants(proc.pid))
            ranks = rank_pids(job.marker)
            os.kill(ranks[1], signal.SIGSTOP)
            rc, waited = job.wait(timeout=120)
        finally:
            kill_all(job.marker)
        text = job.text()
        allowed = set(h.addresses)
        outside = {p: bad for p, addrs in found.items()
                   if (bad := {a for a in addrs if not (a.rsplit(":", 1)[0] in allowed
                                                        or ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback)})}
        assert found and outside == {}, found
        named = re.findall(r"corecpu: error: rank 1 on (\S+) stopped responding at step \d+; (\d+) s without progress",
                           text)
        assert rc in (124, 255) and named == [(h.hostnames[1], named[0][1])], f"rc={rc}\n{text[-3000:]}"
        assert waited < 60, text[-3000:]  # step timeout 10 s, the beats compared, the launcher's 10 s grace
        assert "BAD TERMINATION" not in text, text[-3000:]
        assert survivors(job.marker, within=10) == {}  # the stopped rank on the second host included
