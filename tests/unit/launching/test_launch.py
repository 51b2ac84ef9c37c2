"""`corecpu launch` / launch.sh arguments: the script and its arguments, defaults, errors, the launch plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corecpu.errors import CoreCPUError
from corecpu.launching.launch import LaunchRequest, parse_args, plan_launch


def test_launch_takes_a_script_and_leaves_its_arguments_alone(tmp_path):
    script = tmp_path / "my_loop.py"
    script.write_text("")
    req = parse_args(["-n", "2", "--dry-run", str(script), "-f", "x", "--ppn", "3"])
    assert (req.nranks, req.dry_run, req.script, req.script_args) == (2, True, str(script), ["-f", "x", "--ppn", "3"])


def test_launch_sh_style_defaults_to_train_py(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    req = parse_args(["2", "--model", "tiny", "--backend", "ccl"], default_script=str(train))
    assert req.script == str(train) and req.script_args == ["--model", "tiny", "--backend", "ccl"]
    plan = plan_launch(req, {}, sys.executable, usable_cpus=8, which=lambda n: "/x/" + n, port=lambda: 1234)
    assert plan.env["CORECPU_BACKEND"] == "ccl"  # so corecpu.bind reserves the CCL worker core
    assert plan.env["MASTER_PORT"] == "1234" and plan.env["MASTER_ADDR"] == "127.0.0.1"
    assert plan.command[:3] == ["mpirun", "-n", "2"] and "corecpu.bind" in plan.command


@pytest.mark.parametrize("argv, fragment", [
    (["-n", "0", "x.py"], "at least 1"),
    (["-n", "two", "x.py"], "whole number"),
    (["--ppn", "2", "-n", "2", "x.py"], "--ppn only makes sense"),
    (["-n", "2"], "no training script"),
    (["-n", "2", "missing.py"], "not found"),
])
def test_launch_argument_errors(tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    with pytest.raises(CoreCPUError, match=fragment):
        parse_args(argv)


def test_launch_oversubscription_and_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a:4\n# comment\nnode-b\n")
    req = LaunchRequest(8, "train.py", hostfile=str(hosts), ppn=4)
    plan = plan_launch(req, {}, "python", usable_cpus=2, which=lambda n: "/x/" + n, port=lambda: 1)
    assert plan.env["MASTER_ADDR"] == "node-a" and plan.env["MASTER_PORT"] == "29500"
    assert "--oversubscribe" in plan.command and plan.warnings
    assert plan.command[:7] == ["mpirun", "-n", "8", "-f", str(hosts), "-ppn", "4"]
    with pytest.raises(CoreCPUError, match="do not fit"):
        plan_launch(LaunchRequest(9, "train.py", hostfile=str(hosts), ppn=4), {}, "python", 8,
                    which=lambda n: "/x/" + n)


def test_a_hostfile_host_that_does_not_resolve_is_one_line(tmp_path):
    from corecpu.launching.launch import unresolved_host

    assert unresolved_host("hosts", ["localhost", "127.0.0.1"]) is None
    problem = unresolved_host("hosts", ["localhost", "no-such-node.invalid"])
    assert problem.startswith("hostfile 'hosts': host 'no-such-node.invalid' does not resolve (")
    assert problem.endswith("fix the name, or add it to /etc/hosts or DNS") and "\n" not in problem
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:1\nno-such-node.invalid:1\n")
    (tmp_path / "job.py").write_text("")
    proc = subprocess.run([sys.executable, "-m", "corecpu.launch", "-n", "2", "-f", str(hostfile), "job.py"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"corecpu: error: {unresolved_host(str(hostfile), ['no-such-node.invalid'])}"]


def test_a_bad_omp_num_threads_is_refused_before_any_rank_starts():
    # Issue 30 case 11(e): corecpu.bind replaced OMP_NUM_THREADS=banana in every rank without a word.
    with pytest.raises(CoreCPUError, match="OMP_NUM_THREADS='banana' is not a number of threads"):
        plan_launch(LaunchRequest(2, "train.py"), {"OMP_NUM_THREADS": "banana"}, "python", 8,
                    which=lambda n: "/x/" + n, port=lambda: 1)
