"""train.py's fast exit under Intel MPI: a rank that initialised MPI and skips the interpreter's teardown still
finalises MPI, or the process manager kills the ranks still running (exit 255, "KILLED BY SIGNAL: 9")."""

from __future__ import annotations

from helpers.spawn import mpirun, needs_mpirun


@needs_mpirun
def test_the_first_rank_out_does_not_take_the_other_down(tmp_path):
    proc = mpirun("fast_exit_mpi.py", str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert "KILLED" not in proc.stdout + proc.stderr
