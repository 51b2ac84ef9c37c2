"""corecpu's torchrun: its stores listen on loopback when their address is loopback, elsewhere as torch makes them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from corecpu.launching.launch import TORCHRUN_MODULE, parse_args, plan_launch
from corecpu.launching import torchrun
from corecpu.launching.torchrun import failed_rank_line, loopback_ip, loopback_store_arguments


def test_loopback_addresses_are_recognised():
    assert loopback_ip("127.0.0.1") == "127.0.0.1"
    assert loopback_ip("localhost") == "127.0.0.1"  # IPv4 first, whatever order getaddrinfo gives
    assert loopback_ip("::1") == "::1"
    assert loopback_ip("10.0.0.5") is None and loopback_ip("no-such-host.invalid") is None


def test_a_loopback_server_gets_a_socket_bound_there():
    # torchrun's static rendezvous passes the first arguments by position, the others by keyword.
    kwargs = loopback_store_arguments(("127.0.0.1", 0, 2, True), {"multi_tenant": True})
    fd = kwargs.pop("master_listen_fd")
    with socket.socket(fileno=fd) as s:
        assert s.getsockname()[0] == "127.0.0.1" and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    assert kwargs == {"host_name": "127.0.0.1", "port": 0, "world_size": 2, "is_master": True, "multi_tenant": True}
    # A client, another host's address, or a caller's own socket: left alone.
    assert "master_listen_fd" not in loopback_store_arguments(("127.0.0.1", 29500), {"is_master": False})
    assert "master_listen_fd" not in loopback_store_arguments(("10.0.0.5", 29500), {"is_master": True})
    assert loopback_store_arguments(("127.0.0.1", 1), {"is_master": True, "master_listen_fd": 7})["master_listen_fd"] == 7


def test_patched_tcpstore_listens_on_loopback_only():
    # In a child: the patch replaces torch.distributed.TCPStore for the whole process.
    code = textwrap.dedent("""
        from corecpu.launching.torchrun import patch_tcpstore
        from corecpu.cluster.listeners import listeners
        patch_tcpstore()
        from torch.distributed import TCPStore
        store = TCPStore("127.0.0.1", 0, 1, True, multi_tenant=True, wait_for_workers=False)
        print(sorted({s.address for s in listeners() if s.port == store.port}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['127.0.0.1']"  # unpatched: ['::'] (every interface, IPv4 and IPv6)


def test_launch_runs_torchrun_through_it_on_loopback(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text("")
    plan = plan_launch(parse_args(["-n", "2", "--launcher", "torchrun", str(script)]), {}, sys.executable,
                       usable_cores=8, which=lambda n: "/x/" + n)
    cmd = plan.command
    assert cmd[:3] == [sys.executable, "-m", TORCHRUN_MODULE]
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == "127.0.0.1:0" and cmd[cmd.index("--local-addr") + 1] == "127.0.0.1"



def test_the_users_master_addr_is_kept_or_the_reason_said(tmp_path):
    # Issue 30 case 10: MASTER_ADDR=127.0.0.2 became 127.0.0.1 under torchrun without a word.
    script = tmp_path / "loop.py"
    script.write_text("")

    def plan(addr: str):
        return plan_launch(parse_args(["-n", "2", "--launcher", "torchrun", str(script)]), {"MASTER_ADDR": addr},
                           sys.executable, usable_cores=8, which=lambda n: "/x/" + n, port=lambda: 1)

    kept = plan("127.0.0.2")
    assert kept.command[kept.command.index("--rdzv-endpoint") + 1] == "127.0.0.2:0"
    assert kept.command[kept.command.index("--local-addr") + 1] == "127.0.0.2" and kept.warnings == []
    assert plan("localhost").warnings == []
    other = plan("192.0.2.7")  # not loopback: torchrun's stores would listen on the network
    assert other.command[other.command.index("--local-addr") + 1] == "127.0.0.1"
    assert len(other.warnings) == 1 and "MASTER_ADDR=192.0.2.7 is not a loopback address" in other.warnings[0]


def test_the_failed_rank_is_named_in_one_line():
    assert failed_rank_line(1, -9, 4242, "node-a") == ("corecpu: error: rank 1 (pid 4242) on node-a was killed by "
                                                      "SIGKILL; torchrun ended the job")
    assert failed_rank_line(0, 3, 17, "node-b").endswith("rank 0 (pid 17) on node-b exited with code 3; torchrun ended the job")
    assert failed_rank_line(0, 75, 17, "node-b") == ("corecpu: rank 0 (pid 17) on node-b stopped on request (exit 75); "
                                                    "torchrun ended the job")  # a stop with a checkpoint is no error


def test_a_failed_rank_takes_the_others_with_sigkill_but_a_stopping_rank_leaves_them_to_save(tmp_path):
    # Stand-in workers: rank 1 ends (SIGKILL, or exit 75 as a rank that stopped and saved); rank 0 reports a SIGTERM.
    worker = tmp_path / "worker.sh"
    worker.write_text("#!/bin/sh\ntrap 'echo \"rank $RANK got TERM\" >&2; exit 3' TERM\n"
                      "if [ \"$RANK\" = 1 ]; then sleep 1; eval \"$END\"; fi\nsleep 30 & wait\n")
    worker.chmod(0o755)
    for end, expect_term in (("kill -9 $$", False), ("exit 75", True)):
        out = subprocess.run([sys.executable, "-m", TORCHRUN_MODULE, "--nnodes", "1", "--rdzv-backend", "c10d",
                              "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1", "--nproc-per-node", "2",
                              "--no-python", str(worker)], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, env={**os.environ, "END": end, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 1 and ("rank 0 got TERM" in out.stderr) == expect_term, out.stderr
        assert "Traceback" not in out.stderr and "Sending process" not in out.stderr, out.stderr


def test_the_agent_raises_on_the_first_stop_signal_only(monkeypatch):
    from torch.distributed.elastic.multiprocessing import api  # torch: this module's other tests run without it

    monkeypatch.setattr(api, "_terminate_process_handler", api._terminate_process_handler)
    torchrun.one_stop_signal()
    with pytest.raises(api.SignalException):
        api._terminate_process_handler(signal.SIGTERM, None)
    api._terminate_process_handler(signal.SIGTERM, None)  # scancel's copy after corecpu launch's: no second raise


def test_torchruns_log_directory_goes_when_the_job_ends_unless_a_worker_wrote_an_error_file_there(tmp_path):
    # torchrun alone leaves a /tmp/torchelastic_*/ behind every launch; TMPDIR points both it and corecpu's here.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    error_file = 'echo \'{"message": "boom", "timestamp": 1}\' > "$TORCHELASTIC_ERROR_FILE"; exit 3'
    for body, code, kept in (("exit 0", 0, False), ("exit 3", 1, False), (error_file, 1, True)):
        out = subprocess.run([sys.executable, "-m", TORCHRUN_MODULE, "--nnodes", "1", "--rdzv-backend", "c10d",
                              "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1", "--nproc-per-node", "1",
                              "--no-python", "sh", "-c", body], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"})
        assert out.returncode == code, out.stderr
        left = [p.name for p in tmp.iterdir()]
        assert (left != []) == kept and all(name.startswith("corecpu-torchrun-") for name in left), left
    assert "boom" in out.stderr and [p.name for p in tmp.rglob("*") if p.is_file()] == ["error.json"], out.stderr
