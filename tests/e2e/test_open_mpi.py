"""corecpu launch through Open MPI's mpirun, as many clusters and images preinstall it (and as root, as on the
16-core node of issue 29): the ranks start, their gradients go over Open MPI through mpi4py, a stop saves and
ends with exit 75 and its line, and an mpi4py on another MPI is named in one line.

Skipped where no Open MPI mpirun is on PATH beside this environment's Intel MPI (.ci/run installs openmpi-bin)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corecpu.launching import mpirun
from helpers.common import ROOT
from helpers.launching import TINY, records


def open_mpi_bindir() -> str | None:
    """The folder of an Open MPI `mpirun` on PATH, this environment's own folder left out."""
    own = str(Path(sys.executable).parent)
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != own)
    found = shutil.which("mpirun", path=path)
    if found and mpirun.detect(found).family == mpirun.OPEN_MPI:
        return str(Path(found).parent)
    return None


BINDIR = open_mpi_bindir()
pytestmark = pytest.mark.skipif(BINDIR is None, reason="no Open MPI mpirun on PATH (apt-get install openmpi-bin)")
STOP_LINE = re.compile(r"^stopped by SIGINT at step (\d+); checkpoint step-\d+ written; continue with --resume auto$")


def open_mpi_env(**extra: str) -> dict[str, str]:
    # Open MPI's mpirun first on PATH, this environment's python next (so corecpu launch adds nothing before it).
    own = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{BINDIR}{os.pathsep}{own}{os.pathsep}{os.environ['PATH']}", **extra}


def start(*args: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "corecpu.launch", "-n", "2", str(ROOT / "train.py"), *args],
                            env=open_mpi_env(**extra), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def run(*args: str, **extra: str) -> tuple[int, str]:
    proc = start(*args, **extra)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def test_ranks_start_under_open_mpi_and_their_gradients_go_over_it(tmp_path):
    losses = {}
    for path in ("mpi", "gloo"):
        code, out = run(*TINY, "--max-steps", "6", "--grad-accum", "2", "--log-every", "1", "--eval-data", "none",
                        "--allreduce", path, "--output-dir", str(tmp_path / path))
        assert code == 0, out[-3000:]
        assert "rank(s) via openmpi (Open MPI " in out and f"gradient all-reduce {path} (requested" in out
        if os.geteuid() == 0:
            assert "--allow-run-as-root (it refuses root without it)" in out
        losses[path] = [(r["step"], r["loss"]) for r in records(tmp_path / path)[0]]
    assert len(losses["mpi"]) == 6 and losses["mpi"] == losses["gloo"]  # 2 ranks: the same sums, bit for bit


def test_a_stop_under_open_mpi_saves_exits_75_ends_with_its_line_and_resumes(tmp_path):
    out_dir = tmp_path / "run"
    proc = start(*TINY, "--max-steps", "100000", "--log-every", "1", "--eval-data", "none", "--output-dir", str(out_dir))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out_dir / "metrics.jsonl"
        if metrics.exists() and sum(1 for line in metrics.read_text().splitlines() if line.endswith("}")) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert proc.returncode == 75, out[-3000:]
    assert STOP_LINE.match(lines[-1]), out[-3000:]  # after Open MPI's own report of the exit 75
    stopped = json.loads((out_dir / "stopped.json").read_text())
    assert stopped["signal"] == "SIGINT" and stopped["step"] == int(STOP_LINE.match(lines[-1]).group(1))
    code, out = run(*TINY, "--max-steps", str(stopped["step"] + 2), "--eval-data", "none", "--resume", "auto",
                    "--output-dir", str(out_dir))
    assert code == 0, out[-3000:]
    assert not (out_dir / "stopped.json").exists()


IMPI = Path(sys.prefix, "lib", "libmpi.so.12")  # impi-rt's library, which the mpi extra installs


@pytest.mark.skipif(not mpirun.mpi4py_has_both_abis() or not IMPI.exists(),
                    reason="needs mpi4py's two-ABI wheel and impi-rt, as the mpi extra installs them")
def test_mpi4py_on_another_mpi_than_the_launcher_s_is_named_in_one_line(tmp_path):
    # The user pointed mpi4py at Intel MPI's library (corecpu keeps a user's choice): each rank then starts a
    # world of its own.
    code, out = run(*TINY, "--max-steps", "2", "--eval-data", "none", "--allreduce", "mpi",
                    "--output-dir", str(tmp_path / "run"), MPI4PY_LIBMPI=str(IMPI))
    assert code != 0
    errors = [line for line in out.splitlines() if line.startswith("corecpu: error: MPI says rank")]
    assert errors and "mpi4py loaded Intel(R) MPI Library" in errors[0] and "openmpi launcher" in errors[0], out[-3000:]
    assert "Traceback" not in out


def test_two_hosts_through_open_mpi(tmp_path):
    """-f HOSTFILE under Open MPI: its --host/--map-by syntax, one rank per network-namespace host (orted started
    through the hosts' bootstrap script, as ssh would), the gradients over Open MPI across them, equal weights."""
    from helpers.netns import two_hosts

    out = tmp_path / "run"
    with two_hosts() as h:
        # ssh runs the command line it is given in a shell on the host, and Open MPI's rsh launcher counts on that
        # (`PATH=...; export PATH; orted ...`): the hosts' bootstrap script runs its words as they are, so a shell.
        agent = tmp_path / "ssh.sh"
        agent.write_text("#!/bin/sh\n"
                         "while [ $# -gt 0 ]; do case \"$1\" in -[bcDEeFIiJLlmOoPpQRSWw]) shift 2;; -*) shift;; "
                         "*) break;; esac; done\n"
                         f"host=$1; shift\nexec {h.bootstrap_exec} \"$host\" /bin/sh -c \"$*\"\n")
        agent.chmod(0o755)
        env = {"PATH": open_mpi_env()["PATH"], "OMPI_MCA_plm_rsh_agent": str(agent),
               # Open MPI's own links between the hosts: the veth, not loopback or a namespace's other interfaces
               "OMPI_MCA_oob_tcp_if_include": h.iface, "OMPI_MCA_btl_tcp_if_include": h.iface,
               "MASTER_ADDR": None, "MASTER_PORT": None}
        cmd = [sys.executable, "-m", "corecpu.launch", "-n", "2", "-f", str(h.hostfile), str(ROOT / "train.py"),
               *TINY, "--max-steps", "6", "--eval-data", "none", "--allreduce", "mpi", "--output-dir", str(out)]
        r = h.run_in(h.namespaces[0], cmd, env=env, timeout=240, cwd=ROOT)
    log = f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, log
    assert "2 rank(s) via openmpi" in r.stdout and "gradient all-reduce mpi (requested" in r.stdout, log
    summary = json.loads((out / "summary.json").read_text())
    ranks = summary["ranks"]
    assert summary["steps"] == 6 and [v["rank"] for v in ranks] == [0, 1]
    assert ranks[0]["param_checksum"] == ranks[1]["param_checksum"]
    topo = json.loads((out / "topology.json").read_text())["ranks"]
    assert len({t["host"] for t in topo}) == 2, topo  # one rank on each host
