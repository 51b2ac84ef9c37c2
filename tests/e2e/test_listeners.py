"""What a single-host job listens on: loopback only, under mpirun and under torchrun.

Before: hydra_pmi_proxy listened on 0.0.0.0 and both ranks held that socket (mpirun); torchrun's two stores
listened on `*` (IPv4 and IPv6). The multi-host case is in test_multihost.py.
"""

from __future__ import annotations

import ipaddress

import pytest

from helpers.chaoslib import TINY, descendants, kill_all, listening, start, wait_for_step

LONG = [*TINY, "--max-steps", "100000", "--log-every", "1", "--batch-size", "8"]


def not_loopback(found: dict[str, set[str]]) -> dict[str, set[str]]:
    def loopback(endpoint: str) -> bool:
        address = ipaddress.ip_address(endpoint.rsplit(":", 1)[0])
        return (getattr(address, "ipv4_mapped", None) or address).is_loopback
    return {proc: bad for proc, addrs in found.items() if (bad := {a for a in addrs if not loopback(a)})}


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_single_host_job_listens_on_loopback_only(tmp_path, launcher):
    job = start(tmp_path, 2, *LONG, "--launcher", launcher)
    try:
        wait_for_step(job, 3)  # every process of the job is up: launcher, proxy or agent, both ranks
        found = listening(descendants(job.proc.pid))
    finally:
        kill_all(job.marker)
        job.proc.kill()
        job.wait(timeout=30)
    assert found, "no process of the job listens at all: the check is not looking at the job"
    assert not_loopback(found) == {}, found
