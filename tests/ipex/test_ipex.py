"""train.py with Intel Extension for PyTorch: ipex.optimize, checkpoints, final/, DDP.

IPEX stopped at 2.8 and needs torch 2.8 exactly, so these tests run from a separate
environment that has both (the project's own .venv has a newer torch and skips them).
tests/ipex_env.sh builds that environment once (cached under ~/.cache/corecpu) and runs them:

    tests/ipex_env.sh

Each test runs train.py in a subprocess with the tiny model, like tests/e2e/test_train.py. This folder is
its own tier (marked e2e by tests/conftest.py): a different interpreter runs it, and in .venv it skips whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corecpu.cpu.hardware import CCL, installed_extension, ipex_status, read_cpu_features
from helpers.common import ROOT, free_port

# ipex_status() compares versions before importing: IPEX built for another torch does not raise
# ImportError on import (its version check calls a non-existent os.exit), so importorskip alone would error.
_STATUS = ipex_status()
if not _STATUS.usable:
    pytest.skip(f"IPEX path not testable in this interpreter: {_STATUS.reason} "
                "(IPEX 2.8 needs torch 2.8; run from an env that has both)", allow_module_level=True)
ipex = pytest.importorskip("intel_extension_for_pytorch", reason="intel_extension_for_pytorch is not importable here")

PRECISIONS = [
    "fp32",
    pytest.param("bf16", marks=pytest.mark.skipif(
        not read_cpu_features().has_native_bf16, reason="IPEX bf16 training needs a CPU with avx512_bf16 or amx_bf16")),
]
COMMON = ["--model", "tiny", "--progress", "off", "--eval-data", "none", "--log-every", "5"]
_CCL_PROBLEM = installed_extension(*CCL)


def train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *COMMON, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _env_dir() -> Path:
    env_dir = Path(sys.executable).parent.parent
    if not (env_dir / ".corecpu-installed").is_file():
        pytest.skip("launch.sh would install the project into this env; run through tests/ipex_env.sh")
    return env_dir


def _best_precision() -> str:
    return "bf16" if read_cpu_features().has_native_bf16 else "fp32"


def _launch_sh(*args: str) -> subprocess.CompletedProcess:
    """./launch.sh 2 from this env, as a user who activated it would run it."""
    env_dir = _env_dir()
    return subprocess.run(["bash", str(ROOT / "launch.sh"), "2", *COMMON, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "VIRTUAL_ENV": str(env_dir),
                                                       "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}"})


@pytest.fixture(scope="module", params=PRECISIONS)
def ipex_run(request, tmp_path_factory):
    """One uninterrupted IPEX run of 10 steps with checkpoints at 5 and 10."""
    precision = request.param
    out = tmp_path_factory.mktemp(f"ipex-{precision}") / "run"
    proc = train("--precision", precision, "--max-steps", "10", "--save-every", "5", "--keep-checkpoints", "5",
                 "--output-dir", str(out))
    return precision, out, proc


def test_ipex_status_is_usable_and_matches_torch():
    import torch

    assert ipex.__version__.split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]


def test_log_line_says_ipex_was_applied(ipex_run):
    precision, _, proc = ipex_run
    assert f"ipex: ipex.optimize applied ({precision})" in proc.stdout, proc.stdout
    assert "has been overridden" not in proc.stderr  # the scheduler warning IPEX's step() triggers is filtered


def test_final_loads_in_plain_transformers_as_fp32(ipex_run):
    _, out, _ = ipex_run
    # In bf16 IPEX keeps bf16 working weights; final/ must still hold and be labelled fp32 (the master weights).
    assert json.loads((out / "final" / "config.json").read_text()).get("dtype", "float32") == "float32"
    code = ("import sys, torch; from transformers import AutoModelForSequenceClassification as M, AutoTokenizer as T;"
            "m = M.from_pretrained(sys.argv[1]); t = T.from_pretrained(sys.argv[1]);"
            "x = t(['a fine kettle'], return_tensors='pt'); print(m(**x).logits.shape[-1], m.dtype);"
            "assert 'corecpu' not in sys.modules and 'intel_extension_for_pytorch' not in sys.modules")
    check = subprocess.run([sys.executable, "-c", code, str(out / "final")], capture_output=True, text=True,
                           cwd=out.parent, timeout=120)
    assert check.returncode == 0, check.stderr[-3000:]
    assert check.stdout.split() == ["2", "torch.float32"]
    # final/ holds exactly the weights of the last checkpoint.
    import torch

    state = torch.load(out / "checkpoints" / "step-00000010" / "state.pt", map_location="cpu", weights_only=True)
    final = weights(out / "final" / "model.safetensors")
    assert final.keys() == state["model"].keys()
    for name, tensor in state["model"].items():
        assert tensor.dtype == torch.float32 and torch.equal(final[name], tensor), name


def test_resume_from_ipex_checkpoint_matches_uninterrupted_run(ipex_run, tmp_path):
    precision, out, _ = ipex_run
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "checkpoints" / "step-00000005", resumed / "checkpoints" / "step-00000005")
    proc = train("--precision", precision, "--max-steps", "10", "--save-every", "5", "--keep-checkpoints", "5",
                 "--output-dir", str(resumed), "--resume", "auto")
    assert "resuming from" in proc.stdout and "(step 5)" in proc.stdout
    a, b = weights(out / "final" / "model.safetensors"), weights(resumed / "final" / "model.safetensors")
    import torch

    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    summary = [json.loads((d / "summary.json").read_text()) for d in (out, resumed)]
    assert summary[0]["final_loss"] == summary[1]["final_loss"]


def test_pretrained_model_dir_trains_with_ipex(ipex_run, tmp_path):
    # from_pretrained() returns a model in eval mode, for which ipex.optimize() takes its inference path and
    # refuses the optimizer; the tiny model is built in train mode and would not notice.
    precision, out, _ = ipex_run
    proc = train("--model", str(out / "final"), "--precision", precision, "--max-steps", "2",
                 "--output-dir", str(tmp_path / "run"))
    assert f"ipex: ipex.optimize applied ({precision})" in proc.stdout


def test_ipex_off_never_imports_ipex(tmp_path):
    proc = train("--ipex", "off", "--max-steps", "2", "--output-dir", str(tmp_path / "run"))
    assert "ipex: off" in proc.stdout
    # Importing IPEX re-registers ATen kernels and says so on stderr.
    assert "intel_extension_for_pytorch" not in proc.stderr and "previously registered kernel" not in proc.stderr


def test_two_ranks_with_ipex_stay_in_sync(tmp_path):
    # torchrun, not launch.sh: launch.sh would pip-install the project's torch pin into this env.
    out, precision = tmp_path / "run", _best_precision()
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(free_port()),
                           str(ROOT / "train.py"), *COMMON, "--precision", precision, "--max-steps", "6",
                           "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ipex: ipex.optimize applied ({precision})" in proc.stdout
    ranks = json.loads((out / "summary.json").read_text())["ranks"]
    assert len(ranks) == 2 and ranks[0]["param_checksum"] == ranks[1]["param_checksum"]


def test_launch_sh_two_ranks_with_ipex(tmp_path):
    # What a user runs: launch.sh (Intel MPI's mpirun, corecpu.bind) from the IPEX environment.
    # launch.sh installs into the active env unless its stamp matches; ipex_env.sh writes that stamp.
    out, precision = tmp_path / "run", _best_precision()
    proc = _launch_sh("--precision", precision, "--max-steps", "6", "--save-every", "3", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s) via" in proc.stdout and f"ipex: ipex.optimize applied ({precision})" in proc.stdout
    ranks = json.loads((out / "summary.json").read_text())["ranks"]
    assert len(ranks) == 2 and ranks[0]["param_checksum"] == ranks[1]["param_checksum"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000003", "step-00000006"]


def test_the_ipex_env_has_ccl_built_for_its_torch():
    """tests/ipex_env.sh builds oneCCL's bindings against torch 2.8 (a CUDA wheel: through a CPU-only view of
    its CMake package), so IPEX, ccl and bf16 run together, as the published recipe has them."""
    _env_dir()  # only in the env ipex_env.sh made; elsewhere nobody promised the bindings
    assert _CCL_PROBLEM is None, _CCL_PROBLEM.reason
    probe = subprocess.run([sys.executable, "-c", "import torch, oneccl_bindings_for_pytorch as b, torch.distributed as d; "
                            "print(torch.__version__, b.__version__, d.Backend.CCL if hasattr(d.Backend, 'CCL') "
                            "else 'ccl' in d.Backend.backend_list)"], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    torch_version, bindings, registered = probe.stdout.split()
    assert torch_version.startswith("2.8.") and bindings.startswith("2.8."), probe.stdout
    assert registered in ("ccl", "True"), probe.stdout


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


@pytest.mark.skipif(_CCL_PROBLEM is not None, reason=f"no ccl here: {_CCL_PROBLEM and _CCL_PROBLEM.reason}")
def test_launch_sh_ccl_with_ipex_and_bf16_trains_as_gloo(tmp_path):
    """./launch.sh 2 --backend ccl with IPEX and bf16 (where the CPU has it): DDP's buckets on oneCCL give
    the losses and weights gloo gives, step by step."""
    precision, runs = _best_precision(), {}
    for backend in ("ccl", "gloo"):
        out = tmp_path / backend
        proc = _launch_sh("--backend", backend, "--allreduce", backend, "--precision", precision, "--max-steps", "6",
                          "--log-every", "1", "--output-dir", str(out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"backend {backend}" in proc.stdout and f"gradient all-reduce {backend}" in proc.stdout, proc.stdout
        assert f"ipex: ipex.optimize applied ({precision})" in proc.stdout
        runs[backend] = out
    ccl, gloo = (_metrics(runs[b]) for b in ("ccl", "gloo"))
    assert [m["step"] for m in ccl] == [m["step"] for m in gloo] == list(range(1, 7))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(ccl, gloo)) <= 1e-6, (ccl, gloo)
    a, b = (weights(runs[x] / "final" / "model.safetensors") for x in ("ccl", "gloo"))
    assert a.keys() == b.keys() and max(float((a[k].float() - b[k].float()).abs().max()) for k in a) <= 1e-6


def _ipexrun_env(output: str) -> dict[str, str]:
    """The variables ipexrun says it exported to every rank ("... env: KEY=VALUE" lines)."""
    return dict(m.groups() for m in re.finditer(r"env: (\w+)=(\S*)", output))


def test_ipexrun_with_ipex_and_bf16_binds_as_corecpus_plan(tmp_path):
    """The command README gives: `ipexrun cpu --nnodes 1 --nprocs-per-node 2 --ccl-worker-count 0 train.py`, with
    IPEX and bf16, and `--backend ccl` (gloo where no bindings are built for this torch). ipexrun
    binds the ranks and reserves oneCCL's worker cores itself; corecpu must run in that binding, and for the
    same ranks on the same machine its own plan must bind the same way."""
    env_dir, out, precision = _env_dir(), tmp_path / "run", _best_precision()
    backend = "gloo" if _CCL_PROBLEM else "ccl"  # the published recipe's init_process_group("ccl")
    proc = subprocess.run([str(env_dir / "bin" / "ipexrun"), "cpu", "--nnodes", "1", "--nprocs-per-node", "2",
                           "--ccl-worker-count", "0", "--master-port", str(free_port()), str(ROOT / "train.py"),
                           *COMMON, "--backend", backend, "--precision", precision, "--max-steps", "6",
                           "--output-dir", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"ipex: ipex.optimize applied ({precision})" in proc.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["backend"] == backend, (config["resolved"], config["decisions"]["backend"])
    ranks = json.loads((out / "summary.json").read_text())["ranks"]
    assert len(ranks) == 2 and ranks[0]["param_checksum"] == ranks[1]["param_checksum"]

    given = _ipexrun_env(proc.stdout + proc.stderr)
    plan = json.loads(subprocess.run([sys.executable, "-m", "corecpu.cli", "plan", "--nproc", "2", "--backend", "ccl",
                                      "--binding", "core", "--json"], cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    # Same cores per rank, same threads, the same CPUs (here: none) left to oneCCL's workers.
    assert given["I_MPI_PIN_DOMAIN"] == plan["env"]["I_MPI_PIN_DOMAIN"], (given, plan["env"])
    assert int(given["OMP_NUM_THREADS"]) == plan["ranks"][0]["omp_num_threads"], (given, plan["ranks"])
    reserved = sorted(c for r in plan["ranks"] for c in r["ccl_worker_cpus"])
    assert sorted(int(c) for c in given["CCL_WORKER_AFFINITY"].split(",") if c) == reserved, (given, plan["ranks"])
    # ... and rank 0 ran in ipexrun's binding, with oneCCL settings that say where its collectives progress.
    decisions = config["decisions"]
    assert decisions["cpus"] == plan["ranks"][0]["cpus"] and "launcher bound" in decisions["threads"], decisions
    assert decisions["launcher"].startswith("intel-mpi: rank 0 of 2"), decisions["launcher"]
    if backend == "ccl":
        assert "CCL_PROCESS_LAUNCHER=hydra" in decisions["backend"], decisions["backend"]
