"""A batch job's environment for running examples/slurm/train.sbatch without Slurm: the variables
sbatch gives the batch step, the fake srun (tests/helpers/fake_srun.py) and a fake scontrol that
records its arguments first on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers.common import ROOT

SBATCH = ROOT / "examples/slurm/train.sbatch"
FAKE_SRUN = ROOT / "tests/helpers/fake_srun.py"
JOB_ID = "31337"

# `scontrol ARGS` appends ARGS (one line) to $FAKE_SCONTROL_LOG, as the requeue the script asks for.
FAKE_SCONTROL = '#!/bin/sh\nprintf "%s\\n" "$*" >> "$FAKE_SCONTROL_LOG"\n'


def sbatch_env(tmp_path: Path, nodes: list[str], tasks_per_node: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The batch step's environment as sbatch gives it, plus the fake srun and scontrol first on PATH."""
    import hostlist

    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    if not (shim / "srun").exists():
        (shim / "srun").symlink_to(FAKE_SRUN)
        (shim / "scontrol").write_text(FAKE_SCONTROL)
        (shim / "scontrol").chmod(0o755)
    FAKE_SRUN.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "PMI_", "RANK", "WORLD_SIZE"))}
    env.update({
        "PATH": os.pathsep.join([str(shim), str(Path(sys.executable).parent), env.get("PATH", "")]),
        "FAKE_SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "SLURM_JOB_ID": JOB_ID, "SLURM_JOBID": JOB_ID, "SLURM_JOB_NAME": "corecpu",
        "SLURM_JOB_NODELIST": hostlist.collect_hostlist(nodes), "SLURM_NODELIST": hostlist.collect_hostlist(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_NTASKS": str(len(nodes) * tasks_per_node), "SLURM_NPROCS": str(len(nodes) * tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{len(nodes)})",
        "SLURM_CPUS_PER_TASK": "1", "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_PROCID": "0", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": nodes[0], "PYTHONPATH": str(ROOT),
    })
    env.update(extra or {})
    return env


def scontrol_calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []
