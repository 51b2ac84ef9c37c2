"""`corecpu env`: the report's facts come from the same functions a run uses, the launcher and plan
problems are reported rather than raised, and it stays torch-free."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from corecpu.cli import build_parser
from corecpu.cpu.cgroups import read_memory_limit
from corecpu.launching.environment import collect, render_text
from helpers.common import ROOT
from helpers.kubernetes import pytorchjob_pod_env
from helpers.sysfs_fixtures import make_cgroup, make_machine


def env_cli(argv: list[str], capsys) -> str:
    args = build_parser().parse_args(["env", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_json_report_of_a_fake_machine(tmp_path, capsys):
    sysfs = make_machine(tmp_path / "m", "two_socket")
    cg, _ = make_cgroup(tmp_path / "cg", 2.5)
    (cg / "memory.max").write_text("4294967296\n")
    report = json.loads(env_cli(["--json", "--sysfs", str(sysfs), "--cgroup", str(cg), "--cpuinfo",
                                 str(sysfs / "cpuinfo"), "--allowed-cpus", "0-15"], capsys))
    assert report["packages"]["torch"] == importlib.metadata.version("torch")
    assert report["packages"]["transformers"] == importlib.metadata.version("transformers")
    assert set(report["packages"]) >= {"impi-rt", "mpi4py", "oneccl_bindings_for_pytorch",
                                       "intel_extension_for_pytorch", "deepspeed"}
    assert report["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480+ (fake)"  # from --cpuinfo, not this CPU
    assert report["cgroup"] == {"cpu_quota": 2.5, "cpuset": None, "memory_bytes": 4294967296}
    plan = report["plan"]
    assert plan["machine"]["sockets"] == 2 and plan["machine"]["cpu_quota"] == 2.5
    assert len(plan["ranks"]) == 2  # auto: one rank per NUMA node
    assert report["python"] == sys.version.split()[0]


def test_text_report_names_the_launcher_and_each_rank(tmp_path, capsys):
    sysfs = make_machine(tmp_path / "m", "two_socket")
    text = env_cli(["--sysfs", str(sysfs), "--cpuinfo", str(sysfs / "cpuinfo"), "--allowed-cpus", "0-15",
                    "--nproc", "4"], capsys)
    assert f"- torch: {importlib.metadata.version('torch')}\n" in text
    assert "- launcher: single (rank 0 of 1)\n" in text
    assert sum(line.startswith("- plan rank ") for line in text.splitlines()) == 4


def test_launcher_and_plan_problems_are_reported_not_raised():
    report = collect(None, "--nproc 99 does not fit", env={**pytorchjob_pod_env(rank=0, nproc="2"), "PATH": ""})
    assert report["launcher"]["detected"] is None and "torchrun" in report["launcher"]["error"]
    assert report["plan"] == {"error": "--nproc 99 does not fit"}
    text = render_text(report)
    assert "- plan: --nproc 99 does not fit\n" in text and "torchrun" in text


def test_launcher_detected_from_torchrun_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "PATH": ""}
    la = collect(None, "n/a", env=env)["launcher"]
    assert (la["detected"], la["rank"], la["world_size"]) == ("torchrun", 1, 2)


@pytest.mark.parametrize("text, expected", [("1073741824\n", 1073741824), ("max\n", None)])
def test_memory_limit_from_cgroup_v2(tmp_path, text, expected):
    cg, proc = make_cgroup(tmp_path, None)
    (cg / "memory.max").write_text(text)
    assert read_memory_limit(cg, proc) == expected


def test_memory_limit_from_cgroup_v1_ignores_the_no_limit_value(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "proc").write_text("5:memory:/\n")
    assert read_memory_limit(tmp_path, tmp_path / "proc") is None
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("2147483648\n")
    assert read_memory_limit(tmp_path, tmp_path / "proc") == 2147483648


def test_corecpu_env_does_not_import_torch():
    code = ("import sys, corecpu.cli as c\n"
            "try:\n    c.main(['env', '--json'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "assert 'torch' not in sys.modules, 'corecpu env imported torch'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["packages"]["corecpu"]
