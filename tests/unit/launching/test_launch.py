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
    plan = plan_launch(req, {}, sys.executable, usable_cores=8, which=lambda n: "/x/" + n, port=lambda: 1234)
    assert plan.env["CORECPU_BACKEND"] == "ccl"  # so corecpu.bind reserves the CCL worker core
    assert plan.env["MASTER_PORT"] == "1234" and plan.env["MASTER_ADDR"] == "127.0.0.1"
    assert plan.command[:3] == ["mpirun", "-n", "2"] and "corecpu.bind" in plan.command


@pytest.mark.parametrize("argv, fragment", [
    (["-n", "0", "x.py"], "at least 1"),
    (["-n", "two", "x.py"], "whole number"),
    (["--ppn", "2", "-n", "3", "x.py"], "give one of them"),
    (["-n", "2"], "no training script"),
    (["-n", "2", "missing.py"], "not found"),
    (["x.py"], "how many ranks"),
    (["-n", "2", "--bogus", "x.py"], "unrecognized arguments: --bogus"),
    (["--nnodes", "2", "--nproc-per-node", "2", "x.py"], "give each --node-rank R and --master-addr"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--nproc-per-node", "2", "x.py"], "not a node of"),
    (["--nnodes", "1:2", "-n", "2", "x.py"], "elastic"),
    (["-n", "2", "--tee", "3", "x.py"], "add --log-dir"),
    (["-n", "2", "--log-dir", "d", "--tee", "0:4", "x.py"], "--tee '0:4'"),
])
def test_launch_argument_errors(tmp_path, monkeypatch, argv, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    with pytest.raises(CoreCPUError, match=fragment):
        parse_args(argv)


@pytest.mark.parametrize("argv", [["--launcher", "torchrun", "2", "--max-steps", "5"], ["--log-dir", "logs", "auto"]])
def test_launch_sh_says_the_number_of_ranks_goes_first(argv):
    # Without the check the bare N went to train.py and the error asked "how many ranks?" of a user who gave them.
    with pytest.raises(CoreCPUError, match=f"the number of ranks goes first.*got '{argv[2]}' after an option"):
        parse_args(argv, default_script="train.py")
    assert parse_args([argv[2], *argv[:2]], default_script="train.py").script_args == []


def test_launch_oversubscription_and_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("node-a:4\n# comment\nnode-b\n")
    req = LaunchRequest(8, "train.py", hostfile=str(hosts), ppn=4, oversubscribe=True)
    plan = plan_launch(req, {}, "python", usable_cores=2, which=lambda n: "/x/" + n, port=lambda: 1)
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


def test_more_ranks_than_cores_needs_oversubscribe_as_corecpu_plan_does():
    # Issue 27: `corecpu plan --nproc 4` refused on 2 cores while `./launch.sh 4` oversubscribed without asking.
    which = lambda n: "/x/" + n  # noqa: E731
    with pytest.raises(CoreCPUError, match=r"4 ranks need 4 cores but this host has 2 usable; start 2 or fewer, "
                                           r"or add --oversubscribe"):
        plan_launch(parse_args(["4"], default_script="train.py"), {}, "python", 2, which=which, port=lambda: 1)
    plan = plan_launch(parse_args(["4", "--oversubscribe"], default_script="train.py"), {}, "python", 2,
                       which=which, port=lambda: 1)
    assert "--oversubscribe" in plan.command and "share cores" in plan.warnings[0]
    plan = plan_launch(parse_args(["2"], default_script="train.py"), {}, "python", 2, which=which, port=lambda: 1)
    assert "--oversubscribe" not in plan.command and not plan.warnings


@pytest.mark.parametrize("argv", [
    ["-n", "2", "job.py"], ["-n2", "job.py"], ["-np", "2", "job.py"], ["--nproc-per-node", "2", "job.py"],
    ["--nproc_per_node=2", "job.py"], ["--nproc", "2", "job.py"], ["--ppn", "2", "job.py"],
    ["--standalone", "--nnodes", "1", "--nproc-per-node", "2", "job.py"], ["-n", "2", "--", "job.py"],
])
def test_every_spelling_of_two_ranks_on_this_host(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("")
    req = parse_args(argv)
    plan = plan_launch(req, {}, "python", 8, which=lambda n: "/x/" + n, port=lambda: 7)
    assert plan.local_ranks == 2 and plan.command[:3] == ["mpirun", "-n", "2"] and req.script == "job.py"


def test_launch_sh_takes_launcher_options_among_train_py_flags(tmp_path):
    train = tmp_path / "train.py"
    train.write_text("")
    argv = ["2", "--log-dir=logs", "--model", "tiny", "--tee", "0:3", "--master-port", "2222", "--lr", "-1",
            "--local-ranks-filter", "0", "--help"]
    req = parse_args(argv, default_script=str(train))
    assert (req.nranks, req.log_dir, req.tee, req.master_port, req.local_ranks_filter) == (2, "logs", "0:3", 2222, "0")
    assert req.script_args == ["--model", "tiny", "--lr", "-1", "--help"]  # --help after N is train.py's
    plan = plan_launch(req, {}, "python", 8, which=lambda n: "/x/" + n, port=lambda: 7)
    assert plan.env["MASTER_PORT"] == "2222" and plan.env["CORECPU_LOG_TEE"] == "0:3"
    assert plan.env["CORECPU_LOG_RANKS_FILTER"] == "0" and "CORECPU_LOG_REDIRECTS" not in plan.env
    # a script named after train.py's flags is not taken for the script; one among the launcher's options is
    assert parse_args(["2", "--model", "tiny", "x.py"], default_script=str(train)).script_args[-1] == "x.py"
    script = tmp_path / "mine.py"
    script.write_text("")
    req = parse_args(["2", "--log-dir", "d", str(script), "--log-dir", "mine"], default_script=str(train))
    assert req.script == str(script) and req.log_dir == "d" and req.script_args == ["--log-dir", "mine"]
    with pytest.raises(CoreCPUError, match="N is 2 but -n says 3"):
        parse_args(["2", "-n", "3"], default_script=str(train))
    assert parse_args(["--nproc-per-node", "3"], default_script=str(train)).ppn == 3  # ./launch.sh --nproc-per-node 3


def test_nnodes_and_node_rank_run_torchrun_on_each_node(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("")
    req = parse_args(["--nnodes", "2", "--node-rank", "1", "--master-addr", "node-a", "--master-port", "29400",
                      "--nproc-per-node", "4", "job.py", "--x"])
    plan = plan_launch(req, {}, "python", 8, which=lambda n: "/x/" + n, port=lambda: 7)
    cmd = plan.command
    assert cmd[cmd.index("--nnodes"):cmd.index("--no-python")] == [
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "node-a", "--master-port", "29400",
        "--nproc-per-node", "4"]
    assert plan.local_ranks == 4 and cmd[-2:] == [str(tmp_path / "job.py"), "--x"]
    with pytest.raises(CoreCPUError, match="use -f HOSTFILE instead"):
        parse_args(["--nnodes", "2", "--node-rank", "0", "--master-addr", "a", "--ppn", "1", "--launcher", "mpirun",
                    "job.py"])
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\nc\n")
    plan = plan_launch(parse_args(["-f", str(hosts), "--nnodes", "2", "--ppn", "3", "job.py"]), {}, "python", 8,
                       which=lambda n: "/x/" + n)
    assert plan.command[:7] == ["mpirun", "-n", "6", "-f", str(hosts), "-ppn", "3"]


def test_a_users_cpu_narrowing_reaches_every_ranks_plan(tmp_path):
    from corecpu.launching.launch import user_cpu_restriction

    # taskset -c 1 ./launch.sh 1: the ranks plan from the cgroup's CPUs, so the launcher must pass the narrowing on.
    assert user_cpu_restriction({1}, (0, 1)) == "1"
    assert user_cpu_restriction({0, 1, 2, 3}, (0, 1, 2, 3)) is None  # nothing narrowed
    assert user_cpu_restriction({0, 1, 7}, (0, 1, 2, 3)) == "0-1"  # only CPUs the cgroup allows
    assert user_cpu_restriction({7}, (0, 1)) is None  # nothing in common: the cgroup's CPUs decide
    script = tmp_path / "train.py"
    script.write_text("")
    plan = plan_launch(parse_args(["1", "--model", "tiny"], default_script=str(script)), {}, sys.executable,
                       usable_cores=1, which=lambda n: "/x/" + n, port=lambda: 1, allowed_cpus="1")
    bind = plan.command[plan.command.index("corecpu.bind") + 1:]
    assert bind[:3] == ["--allowed-cpus", "1", "--"]
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    several = plan_launch(LaunchRequest(2, str(script), hostfile=str(hosts)), {}, sys.executable, usable_cores=1,
                          which=lambda n: "/x/" + n, port=lambda: 1, allowed_cpus="1")
    assert "--allowed-cpus" not in several.command  # this host's mask says nothing of the others'
