"""Helpers for the chaos tier: start real jobs, find their ranks, signal them, look for survivors.

Every job's output directory is unique (pytest's tmp_path) and appears on the command line of
launch.sh, mpirun, mpiexec.hydra, torchrun and every rank, so it serves as the marker to find
(and, at the end, to clean up) every process of that job.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from corecpu.cluster.listeners import listeners, socket_inodes
from helpers.common import ROOT

TINY = ["--model", "tiny", "--precision", "fp32", "--progress", "off", "--eval-data", "none"]


def launch_env(**extra: str) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parent.parent), "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.update(extra)
    return env


@dataclass
class Job:
    proc: subprocess.Popen
    out: Path  # the run's --output-dir: also the marker on every command line
    log: Path
    err: Path | None = None  # stderr on its own, when start() was asked to keep it apart from `log`

    @property
    def marker(self) -> str:
        return str(self.out)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> tuple[int, float]:
        """(exit code, seconds waited). A job that outlives `timeout` is killed and the test fails."""
        t0 = time.monotonic()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_all(self.marker)
            raise AssertionError(f"job still running after {timeout:g}s:\n{self.text()[-3000:]}") from None
        return rc, time.monotonic() - t0


def start(tmp_path: Path, nranks: int, *args: str, name: str = "run", env: dict[str, str] | None = None,
          stderr_apart: bool = False) -> Job:
    """launch.sh in the background; stdout and stderr go to one log, or stderr to its own with `stderr_apart`."""
    out = tmp_path / name
    log = tmp_path / f"{name}.log"
    err = tmp_path / f"{name}.err" if stderr_apart else None
    with open(log, "wb") as f, open(err or os.devnull, "wb") as e:
        proc = subprocess.Popen(["bash", str(ROOT / "launch.sh"), str(nranks), *args, "--output-dir", str(out)],
                                env=env or launch_env(), cwd=ROOT, stdout=f, stderr=e if err else subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Job(proc, out, log, err)


def run(tmp_path: Path, nranks: int, *args: str, name: str, timeout: float = 300) -> Job:
    job = start(tmp_path, nranks, *args, name=name)
    rc, _ = job.wait(timeout)
    assert rc == 0, job.text()[-3000:]
    return job


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in metrics(out) if "loss" in r]


def wait_for_step(job: Job, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.proc.poll() is not None:
            raise AssertionError(f"job ended (rc {job.proc.returncode}) before step {step}:\n{job.text()[-3000:]}")
        if any(r.get("step", 0) >= step for r in metrics(job.out)):
            return
        time.sleep(0.05)
    kill_all(job.marker)
    raise AssertionError(f"no step {step} within {timeout:g}s:\n{job.text()[-3000:]}")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def processes(marker: str) -> dict[int, str]:
    """Live (not zombie) processes whose command line contains `marker`, other than this test process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmd = _cmdline(int(entry.name))
            if marker in cmd and _state(int(entry.name)) != "Z":
                found[int(entry.name)] = cmd
    return found


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def rank_pids(marker: str) -> dict[int, int]:
    """rank -> pid of the train.py processes of the job (from PMI_RANK, RANK or SLURM_PROCID in their environment)."""
    ranks = {}
    for pid in processes(marker):
        argv = _argv(pid)
        # A rank runs python [-u] .../train.py; launchers and corecpu.bind only carry it as an argument.
        script = next((a for a in argv[1:3] if not a.startswith("-")), "")
        if not script.endswith("train.py"):
            continue
        try:
            env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
                       .split("\0") if "=" in v)
        except OSError:
            continue
        rank = env.get("PMI_RANK", env.get("RANK", env.get("SLURM_PROCID")))  # mpirun, torchrun, srun
        if rank is not None:
            ranks[int(rank)] = pid
    return ranks


def launcher_pid(marker: str, program: str) -> int:
    """PID of the job's process running `program` (e.g. torchrun, mpiexec.hydra), by its argv, not its arguments.
    `corecpu launch` runs torchrun as `python -m corecpu.launching.torchrun` (its stores on loopback)."""
    for pid in processes(marker):
        argv = _argv(pid)
        if any(Path(a).name == program for a in argv[:2]) or argv[1:3] == ["-m", f"corecpu.launching.{program}"]:
            return pid
    raise AssertionError(f"no {program} process for {marker}: {processes(marker)}")


def survivors(marker: str, within: float) -> dict[int, str]:
    """Processes of the job still alive after waiting up to `within` seconds for them to go."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = processes(marker)
        if not left:
            return {}
        time.sleep(0.2)
    return processes(marker)


def kill_all(marker: str) -> None:
    for pid in processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def complete_checkpoint(out: Path, step: int) -> Path:
    """The step's checkpoint exists with both files, and no half-written one is left beside it."""
    root = out / "checkpoints"
    path = root / f"step-{step:08d}"
    assert (path / "state.pt").is_file() and (path / "meta.json").is_file(), sorted(p.name for p in root.iterdir())
    assert json.loads((path / "meta.json").read_text())["step"] == step
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")], "a temporary checkpoint was left behind"
    return path


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc): what `scancel` reaches in a job step, and hydra's proxies,
    whose command lines do not carry the job's marker."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        children.setdefault(int(text.rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def listening(pids: list[int]) -> dict[str, set[str]]:
    """"name[pid]" -> {"address:port", ...} for each process holding a listening TCP socket, in that process's
    own network namespace (/proc/PID/net), so a process on a namespace "host" is seen as it is there."""
    found: dict[str, set[str]] = {}
    for pid in pids:
        held = socket_inodes(pid)
        if not held:
            continue
        name = Path(f"/proc/{pid}/comm").read_text().strip() if Path(f"/proc/{pid}/comm").exists() else "?"
        for sock in listeners(f"/proc/{pid}/net"):
            if sock.inode in held:
                found.setdefault(f"{name}[{pid}]", set()).add(f"{sock.address}:{sock.port}")
    return found


def long_eval_set(path: Path) -> Path:
    """An evaluation long enough to stop or kill a rank in the middle of it: 24k examples of ~100 tokens."""
    words = "the river city market north station old bridge garden tower museum harbour".split()
    rng = random.Random(0)
    path.write_text("sentence\tlabel\n" + "".join(
        f"{' '.join(rng.choice(words) for _ in range(90))}\t{rng.choice(['negative', 'positive'])}\n"
        for _ in range(24000)))
    return path
