"""The front door: corecpu.setup() under each launcher's variables, the frozen Run.
Two ranks through it: tests/multiprocess/test_front_door.py."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import corecpu
from corecpu.distributed.shm_sync import SUM_SLOTS
from corecpu.errors import CoreCPUError

# One process of one under each launcher: setup() must read the launcher and create no process group.
LAUNCHER_ENVS = {
    "torchrun": {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
    "intel-mpi": {"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
    "mvapich": {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "1"},
    "slurm": {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1"},
    "single": {},
}


@pytest.fixture
def clean_env(monkeypatch):
    # setenv first so monkeypatch restores even variables that setup() creates (OMP_NUM_THREADS, ...).
    names = [n for env in LAUNCHER_ENVS.values() for n in env]
    for name in names + ["OMP_NUM_THREADS", "CORECPU_THREADS_DECISION", "CORECPU_BOUND_CPUS", "MASTER_ADDR",
                         "MASTER_PORT", "DS_ACCELERATOR"]:
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(threads)


@pytest.mark.parametrize("launcher", sorted(LAUNCHER_ENVS))
def test_setup_reads_each_launcher_once_without_a_process_group(clean_env, launcher):
    for k, v in LAUNCHER_ENVS[launcher].items():
        clean_env.setenv(k, v)
    with corecpu.setup(precision="fp32", allreduce="auto", ipex="off") as run:
        assert run.launch.launcher == launcher
        assert (run.rank, run.world_size, run.local_rank, run.is_main) == (0, 1, 0, True)
        assert not torch.distributed.is_initialized()
        d = run.describe()
        assert d["backend"].startswith("none") and d["allreduce"].startswith("none")
        assert d["precision"].startswith("fp32") and d["ipex"] == "off"
        assert d["sparse_embedding_allreduce"] == "off (single process)"  # nothing to all-reduce
        assert run.threads >= 1 and str(run.threads) in d["threads"]
        assert run.resolved()["precision"] == "fp32"


def test_deepspeed_is_told_the_cpu_is_the_accelerator_unless_the_user_said(clean_env):
    # Otherwise any DeepSpeed import on a rank (accelerate's unwrap when saving a DDP model) prints a GPU warning.
    with corecpu.setup(precision="fp32", ipex="off"):
        assert os.environ["DS_ACCELERATOR"] == "cpu"
    clean_env.setenv("DS_ACCELERATOR", "xpu")
    with corecpu.setup(precision="fp32", ipex="off"):
        assert os.environ["DS_ACCELERATOR"] == "xpu"


def test_run_is_frozen(clean_env):
    with corecpu.setup(precision="fp32", ipex="off") as run:
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.threads = 99  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, fragment", [
    ({"precision": "fp16"}, "precision must be one of"),
    ({"threads": -1}, "threads must be"),
    ({"dist_timeout": 0}, "dist_timeout must be"),
    ({"ipex": "on"}, "ipex must be"),
    ({"backend": "nccl"}, "backend must be one of"),
])
def test_setup_errors_speak_library_terms(clean_env, kwargs, fragment):
    with pytest.raises(CoreCPUError, match=fragment) as info:
        corecpu.setup(**kwargs)
    assert "--" not in str(info.value).split(";")[0]  # library terms, not CLI flags
    assert not torch.distributed.is_initialized()


def test_precision_auto_is_settled_by_wrap_and_autocast_follows(clean_env):
    with corecpu.setup(ipex="off") as run:
        assert run.precision is None and "settled when the model is wrapped" in run.describe()["precision"]
        with pytest.raises(CoreCPUError, match="before wrap"):
            run.autocast()
        model, opt = run.wrap(torch.nn.Linear(3, 2), None)
        assert run.precision is not None and run.precision.name in ("fp32", "bf16")
        with run.autocast():
            out = model(torch.randn(2, 3))
        assert out.dtype == (torch.bfloat16 if run.precision.name == "bf16" else torch.float32)
        assert type(model) is torch.nn.Linear  # one process: no DDP wrapper
        assert corecpu.unwrap(model) is model


def test_agreeing_reraises_a_library_error(clean_env):
    with corecpu.setup(precision="fp32", ipex="off") as run:
        with pytest.raises(CoreCPUError, match="bad file"):
            with run.agreeing():
                raise CoreCPUError("bad file")


def test_loader_shards_any_map_style_dataset(clean_env):
    data = torch.utils.data.TensorDataset(torch.arange(10).float())
    with corecpu.setup(precision="fp32", ipex="off") as run:
        seen = sorted(int(v) for (batch,) in run.loader(data, batch_size=3, seed=1) for v in batch)
    assert seen == list(range(10))


def test_cpus_the_launcher_gave_are_known_even_if_torch_came_first(monkeypatch):
    from corecpu.cpu import threads
    monkeypatch.setattr(threads, "CPUS_AT_START", frozenset({0, 1, 2, 3}))
    # corecpu.bind said which CPUs this rank has: that wins, whatever was imported first.
    assert threads.launcher_cpus({"CORECPU_BOUND_CPUS": "4-5"}) == (frozenset({4, 5}), None)
    # torch first, but no OpenMP binding variable: the affinity at `import corecpu` is still the launcher's.
    monkeypatch.setattr(threads, "TORCH_LOADED_FIRST", True)
    assert threads.launcher_cpus({}) == (frozenset({0, 1, 2, 3}), None)
    # torch first with OMP_PROC_BIND set: libgomp may have narrowed the mask already; say so.
    cpus, warning = threads.launcher_cpus({"OMP_PROC_BIND": "close"})
    assert cpus == frozenset({0, 1, 2, 3}) and "OMP_PROC_BIND" in warning and "import corecpu first" in warning


# ---------------------------------------------------------------- what the Run holds, and who owns the rest
def _immutable(value: object) -> bool:
    from types import MappingProxyType

    if value is None or isinstance(value, (str, int, float, bool, bytes, frozenset)):
        return True
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    if isinstance(value, MappingProxyType):
        return all(_immutable(v) for v in value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.__dataclass_params__.frozen and all(_immutable(getattr(value, f.name))
                                                        for f in dataclasses.fields(value))
    return False


def test_run_has_no_mutable_field(clean_env):
    from corecpu.cpu.node_plan import NodePlan
    from corecpu.distributed.allreduce import GradientAllreduce
    from corecpu.training.lifetime import Lifetime
    from corecpu.training.loop_clock import LoopClock
    from corecpu.training.run_log import RunLog
    from corecpu.training.wrapping import Once

    # Facts are immutable all the way down; the rest is one of the owners the module docstring names.
    owners = (Lifetime, LoopClock, Once, RunLog, NodePlan, GradientAllreduce)
    with corecpu.setup(precision="fp32", ipex="off") as run:
        run.wrap(torch.nn.Linear(3, 2), None)
        loose = [f.name for f in dataclasses.fields(run)
                 if not (_immutable(getattr(run, f.name)) or isinstance(getattr(run, f.name), owners))]
        assert not loose, f"mutable Run fields: {loose}"
        assert not hasattr(run, "__dict__")  # slots: nothing beside the fields can be attached


def test_the_mutable_check_can_fail():
    @dataclasses.dataclass(frozen=True)
    class Leaky:
        late: dict

    assert not _immutable(Leaky({}))
    assert not _immutable((1, [2]))
    assert _immutable((1, "a", None))


def test_wrap_is_once_and_its_result_is_what_the_run_reports(clean_env):
    with corecpu.setup(precision="fp32", ipex="off") as run:
        assert run.model is None and run.resumed is None and run.precision.name == "fp32"
        model, _ = run.wrap(torch.nn.Linear(3, 2), None)
        assert run.model is model
        with pytest.raises(CoreCPUError, match="wrap\\(\\) was called before"):
            run.wrap(torch.nn.Linear(3, 2), None)


def test_steps_write_the_step_to_the_clock_and_nothing_to_the_run(clean_env):
    data = torch.utils.data.TensorDataset(torch.arange(8).float())
    with corecpu.setup(precision="fp32", ipex="off") as run:
        loader = run.loader(data, batch_size=2, seed=0)
        steps = run.steps(loader, max_steps=3)
        model, _ = run.wrap(torch.nn.Linear(1, 1), None, loader=loader)
        before = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
        seen = []
        for step in steps:
            for (x,) in step.micro_batches():
                step.backward(model(x[:, None]).sum())
            seen.append(run._clock.step)
            with run.evaluating(model):
                pass
        assert seen == [1, 2, 3] and steps.completed == 3 and steps.model is model
        assert {f.name: getattr(run, f.name) for f in dataclasses.fields(run)} == before
        assert "eval" in run.untimed_seconds


def test_a_step_knows_its_fractional_epoch_and_when_an_interval_ends(clean_env):
    """5 batches an epoch in steps of 2, 2 and 1 (a short last group), 2 epochs: transformers' epoch after each,
    --eval-steps 2 (every 2nd step and the last) and 0 (each epoch's end)."""
    data = torch.utils.data.TensorDataset(torch.arange(10).float())
    with corecpu.setup(precision="fp32", ipex="off") as run:
        loader = run.loader(data, batch_size=2, seed=0)
        steps = run.steps(loader, epochs=2, grad_accum=2)
        model, _ = run.wrap(torch.nn.Linear(1, 1), None, loader=loader)
        seen = []
        for step in steps:
            for (x,) in step.micro_batches():
                step.backward(model(x[:, None]).sum())
            seen.append((step.epochs_done, step.ends_interval(2), step.ends_interval(0)))
    assert [s[0] for s in seen] == [0.4, 0.8, 1.0, 1.4, 1.8, 2.0]
    assert [s[1] for s in seen] == [False, True, False, True, False, True]
    assert [s[2] for s in seen] == [False, False, True, False, False, True]


def test_a_step_counting_items_gives_the_gradient_of_the_mean_over_all_of_them(clean_env):
    """micro_batches(count=): batches of unequal item counts, each loss a mean over its items; the step's gradient
    is that of the mean over every item of the step (not the mean of the batches' means)."""
    torch.manual_seed(0)
    xs = [torch.randn(n, 3) for n in (1, 5, 2, 4)]  # 2 steps of 2 micro-batches: (1, 5), (2, 4)
    batches = [{"x": x, "items": len(x)} for x in xs]
    with corecpu.setup(precision="fp32", ipex="off") as run:
        loader = run.loader(batches, 1, shuffle=False, collate_fn=lambda items: items[0])  # an item: one batch
        steps = run.steps(loader, max_steps=2, grad_accum=2)
        model, _ = run.wrap(torch.nn.Linear(3, 1), None)
        grads = []
        for step in steps:
            model.zero_grad()
            for batch in step.micro_batches(count=lambda b: b["items"]):
                assert step.weight == batch["items"]
                step.backward(model(batch["x"]).square().mean())
            grads.append(model.weight.grad.clone())
    for got, (a, b) in zip(grads, [(xs[0], xs[1]), (xs[2], xs[3])]):
        reference = torch.nn.Linear(3, 1)
        reference.load_state_dict(model.state_dict())
        reference(torch.cat([a, b])).square().mean().backward()
        assert torch.allclose(got, reference.weight.grad, atol=1e-6)
        unweighted = torch.nn.Linear(3, 1)
        unweighted.load_state_dict(model.state_dict())
        ((unweighted(a).square().mean() + unweighted(b).square().mean()) / 2).backward()
        assert not torch.allclose(got, unweighted.weight.grad, atol=1e-4)  # the test tells the two apart


@pytest.mark.parametrize("asked, expected", [("auto", "first-token"), ("full", "full")])
def test_wrap_runs_a_classifiers_last_layer_at_its_first_token_and_says_so(clean_env, asked, expected):
    from transformers import BertConfig, BertForSequenceClassification

    from corecpu.compute import first_token

    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=32))
    with corecpu.setup(precision="fp32", ipex="off", attention="sdpa", last_layer=asked) as run:
        assert "settled when the model is wrapped" in run.describe()["last_layer"]
        wrapped, _ = run.wrap(model, None)
        assert run.describe()["last_layer"].startswith(expected)
        assert first_token.is_first_token(first_token.last_layer(model)) == (expected == "first-token")
        assert wrapped(input_ids=torch.randint(0, 100, (2, 5))).logits.shape == (2, 2)


def test_a_few_numbers_are_summed_through_the_shared_step_where_it_has_memory_for_them(clean_env):
    # One host's ranks sum through the shared step's memory (shm_sync), not gloo's milliseconds a call; a list
    # too long for its slots, or a run without the shared step, goes through the process group.
    calls: list[list[float]] = []

    class SharedStep:  # wrap()'s result as far as sums go: a stand-in that doubles, so its use shows
        @staticmethod
        def sum_all(values: list[float]) -> list[float]:
            calls.append(values)
            return [2 * v for v in values]

    with corecpu.setup(precision="fp32", ipex="off") as run:
        assert run.all_reduce_sum([1.0, 2.0]) == [1.0, 2.0]  # before wrap(): the process group's (a copy)
        run._wrapped.set(SharedStep())
        assert run.all_reduce_sum([1.0, 2.0]) == [2.0, 4.0]
        assert run.all_reduce_sum([1.0] * (SUM_SLOTS + 1)) == [1.0] * (SUM_SLOTS + 1)
    assert calls == [[1.0, 2.0]]
