"""Gradient all-reduce path: placeholder until the Intel MPI path lands."""

from __future__ import annotations

from typing import Mapping

from corecpu.errors import CoreCPUError
from corecpu.launchers import LaunchInfo


def choose_allreduce(requested: str, info: LaunchInfo, env: Mapping[str, str]) -> tuple[str, str]:
    if info.world_size == 1:
        return "none", "single process"
    if requested == "mpi":
        raise CoreCPUError("allreduce 'mpi' is not available yet")
    return "gloo", "gloo process group"


def make_allreduce():
    raise CoreCPUError("allreduce 'mpi' is not available yet")
