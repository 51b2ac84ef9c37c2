"""Time the chaos cases end to end (re-run on a quiet machine; the chaos tests only bound them).

    python benchmarks/chaos_times.py            # prints one row per case: seconds from the event to the end

Each row: case, exit code, seconds from the signal (or from start, for start-up cases) until the job
is gone, and the one line it ended with.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
from chaoslib import ROOT, TINY, launch_env, launcher_pid, rank_pids, start, survivors, wait_for_step  # noqa: E402

LONG = [*TINY, "--max-steps", "100000", "--log-every", "1", "--batch-size", "8"]


def last_line(text: str, *needles: str) -> str:
    hits = [l for l in text.splitlines() if any(n in l for n in needles)]
    return hits[-1][:110] if hits else "-"


def signal_case(tmp: Path, name: str, sig: int, target: str, *extra: str) -> None:
    job = start(tmp, 2, *LONG, *extra, name=name)
    wait_for_step(job, 5)
    if target == "rank 1":
        pid = rank_pids(job.marker)[1]
    elif target == "torchrun":
        pid = launcher_pid(job.marker, "torchrun")
    else:
        pid = job.proc.pid
    t0 = time.monotonic()
    os.kill(pid, sig)
    rc, _ = job.wait(timeout=300)
    left = survivors(job.marker, within=60)
    print(f"{name:28s} rc={rc:<4d} {time.monotonic() - t0:6.1f}s  left={len(left)}  "
          f"{last_line(job.text(), 'stopped by', 'stopped responding', 'error:')}", flush=True)


def startup_case(name: str, env: dict[str, str]) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, "--dist-timeout", "10"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2", **env})
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    print(f"{name:28s} rc={proc.returncode:<4d} {time.monotonic() - t0:6.1f}s  lines={len(lines)}  "
          f"{lines[-1][:110] if lines else '-'}", flush=True)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="corecpu-chaos-"))
    print(f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    signal_case(tmp, "SIGTERM launch.sh", signal.SIGTERM, "launch.sh")
    signal_case(tmp, "SIGINT launch.sh", signal.SIGINT, "launch.sh")
    signal_case(tmp, "SIGUSR1 launch.sh", signal.SIGUSR1, "launch.sh")
    signal_case(tmp, "SIGTERM rank 1", signal.SIGTERM, "rank 1")
    signal_case(tmp, "SIGKILL launch.sh", signal.SIGKILL, "launch.sh")
    signal_case(tmp, "SIGKILL torchrun agent", signal.SIGKILL, "torchrun", "--launcher", "torchrun")
    signal_case(tmp, "SIGTERM launch.sh torchrun", signal.SIGTERM, "launch.sh", "--launcher", "torchrun")
    signal_case(tmp, "SIGSTOP rank 1 (timeout 20)", signal.SIGSTOP, "rank 1", "--step-timeout", "20")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    startup_case("rank 0 unreachable (10 s)", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    startup_case("MASTER_ADDR unresolvable", {"MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": str(port)})
    with socket.socket() as foreign:
        foreign.bind(("0.0.0.0", 0))
        foreign.listen()
        fport = foreign.getsockname()[1]
        startup_case("rank 1, foreign listener", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(fport)})
        t0 = time.monotonic()
        job = start(tmp, 2, *TINY, "--dist-timeout", "10", name="foreign", env=launch_env(MASTER_PORT=str(fport)))
        rc, _ = job.wait(timeout=300)
        print(f"{'launch.sh, foreign listener':28s} rc={rc:<4d} {time.monotonic() - t0:6.1f}s  "
              f"{last_line(job.text(), 'error:')}", flush=True)


if __name__ == "__main__":
    main()
