"""oneCCL's /dev/shm regions: a rank's own at teardown, a killed rank's by its supervisor or the launcher, and
those of processes long gone at the next launch; nothing else, and nothing a live process holds."""

import os
import subprocess
import sys
import time

from corecpu.cluster import ccl_shm


def _touch(d, *names, age_s=0.0):
    for name in names:
        (d / name).write_bytes(b"\0")
        if age_s:
            t = time.time() - age_s
            os.utime(d / name, (t, t))


def test_a_process_s_regions_go_and_nothing_else(tmp_path):
    pid = 4242
    _touch(tmp_path, f"{pid}:0:0", f"{pid}:1:0", f"{pid + 1}:0:0", f"x{pid}:0:0", f"{pid}:0:0.bak",
           "corecpu-abc-weights")
    (tmp_path / f"{pid}:2:0").mkdir()
    assert sorted(ccl_shm.remove_regions(pid, tmp_path)) == [f"{pid}:0:0", f"{pid}:1:0"]
    assert {p.name for p in tmp_path.iterdir()} == {f"{pid + 1}:0:0", f"{pid}:2:0", "corecpu-abc-weights",
                                                    f"x{pid}:0:0", f"{pid}:0:0.bak"}


def test_stale_means_gone_unmapped_and_old(tmp_path):
    _touch(tmp_path, "101:0:0", "102:0:0", "103:0:0", "not-ccl", age_s=3600)
    _touch(tmp_path, "104:0:0")  # new: a peer may not have mapped it yet
    alive = {102}.__contains__  # 102's process still runs
    mapped = lambda: {"103:0:0"}  # noqa: E731  (a process of another PID namespace's job still maps 103's)
    assert ccl_shm.remove_stale_regions(tmp_path, alive=alive, mapped=mapped) == ["101:0:0"]
    assert {p.name for p in tmp_path.iterdir()} == {"102:0:0", "103:0:0", "104:0:0", "not-ccl"}
    assert ccl_shm.remove_stale_regions(tmp_path, alive=alive, mapped=mapped) == []


def test_a_live_mapping_is_seen_in_proc(tmp_path):
    # A real process maps a real /dev/shm file; the scan of /proc/*/maps finds it by name.
    name = f"corecpu-test-{os.getpid()}:0:0"
    path = ccl_shm.SHM_DIR / name
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys; f = open(sys.argv[1], 'w+b'); f.truncate(4096); m = mmap.mmap(f.fileno(), 4096); "
        "print('ok', flush=True); sys.stdin.read()"), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert name in ccl_shm.mapped_shm_names()
    finally:
        holder.communicate("")
        path.unlink(missing_ok=True)
    assert name not in ccl_shm.mapped_shm_names()


def test_pid_alive():
    assert ccl_shm.pid_alive(os.getpid())
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not ccl_shm.pid_alive(int(done.stdout))


def test_wait_gone_waits_for_an_exiting_process_and_counts_a_zombie_as_gone():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while ccl_shm._running(zombie.pid):  # exited, not reaped: kill(0) still finds it
        time.sleep(0.01)
    assert ccl_shm.pid_alive(zombie.pid)
    assert ccl_shm.wait_gone([quick.pid, zombie.pid], timeout_s=10) == [quick.pid, zombie.pid]
    stays = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert ccl_shm.wait_gone([stays.pid], timeout_s=0.2) == []
    finally:
        stays.kill()
        stays.wait()
        quick.wait()
        zombie.wait()
