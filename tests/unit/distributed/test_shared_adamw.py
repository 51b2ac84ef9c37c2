"""The optimizer sharded through shared memory (corecpu.distributed.shared_adamw), two ranks as two threads of
this process: the same steps as DDP's mean gradient, torch's clip and torch's fused AdamW, within fp32 rounding."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import pytest
import torch

from corecpu.distributed import shm_sync
from corecpu.distributed.shard_choice import decide, shm_bytes, unsupported
from corecpu.distributed.shared_adamw import SharedAdamW
from corecpu.errors import CoreCPUError
from corecpu.training.clipping import GradientClipper
from helpers.thread_ranks import Group, run_ranks as thread_ranks

WORLD = 2
STEPS = 4


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def make_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)  # a group with nothing trained (LoRA's, say)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0},
                              {"params": [frozen], "weight_decay": 0.0}], lr=1e-2, fused=True)


def batches() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(WORLD, STEPS, 5, 8)  # a different batch for each rank at each step


def run_ranks(body: Callable[[int, Group, torch.nn.Module], object]) -> list[object]:
    """`body(rank, group, model)` on a thread per rank; the models are made here (torch's seed is global)."""
    group = Group(WORLD)
    models = [make_model() for _ in range(WORLD)]
    return thread_ranks(WORLD, group, lambda rank: body(rank, group, models[rank]))


def shared_for(rank: int, group: Group, optimizer: torch.optim.Optimizer, shm_dir: Path) -> SharedAdamW:
    return SharedAdamW(optimizer, rank=rank, world=WORLD, barrier=group.barrier,
                       sum_scalar=lambda x: group.sum_scalar(rank, x), share_tag=lambda tag: "test", shm_dir=shm_dir)


def reference(max_norm: float, xs: torch.Tensor) -> tuple[list[torch.Tensor], list[float]]:
    """DDP's arithmetic in one process: the mean of the ranks' gradients, torch's clip, torch's fused AdamW."""
    model = make_model()
    optimizer = make_optimizer(model)
    norms = []
    for step in range(STEPS):
        grads = []
        for rank in range(WORLD):
            model.zero_grad(set_to_none=True)
            model(xs[rank, step]).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / WORLD
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], norms


@pytest.mark.parametrize("max_norm", [0.05, 1e9], ids=["clipped", "unclipped"])
def test_steps_equal_ddp_mean_gradient_with_torch_clip_and_fused_adamw(tmp_path, max_norm):
    xs = batches()

    def rank_body(rank: int, group: Group, model: torch.nn.Module
                  ) -> tuple[list[torch.Tensor], list[float], list[int]]:
        optimizer = make_optimizer(model)
        shared = shared_for(rank, group, optimizer, tmp_path)
        model.register_forward_pre_hook(shared.attach_grads)
        clip = GradientClipper(model.parameters(), optimizer, shared=shared)
        norms, stops, sums = [], [], []
        for step in range(STEPS):
            model(xs[rank, step]).pow(2).mean().backward()
            norms.append(float(clip(max_norm)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if shared.agree_max is not None:  # the loop's stop check between steps: rank 1 is signalled at step 1
                stops.append(shared.agree_max(15 if rank == 1 and step >= 1 else 0))
            if shared.sum_all is not None:  # a log step's numbers, among the step's own waits
                sums.append(shared.sum_all([float(rank + 1), float(step), 0.5]))
        return [p.detach().clone() for p in model.parameters()], norms, stops, sums

    results = run_ranks(rank_body)
    want, want_norms = reference(max_norm, xs)
    for weights, norms, stops, sums in results:
        assert stops == ([0] + [15] * (STEPS - 1) if shm_sync.usable() else [])
        assert sums == ([[3.0, 2.0 * step, 1.0] for step in range(STEPS)] if shm_sync.usable() else [])
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)
        assert norms == pytest.approx(want_norms, rel=1e-5)
    assert max_norm > 1 or any(n > max_norm for n in want_norms)  # the clipped case clips
    assert list(tmp_path.iterdir()) == []  # every file was unlinked once mapped


def test_a_zero_grad_without_a_step_drops_the_gradient_it_held(tmp_path):
    xs = batches()

    def rank_body(rank: int, group: Group, model: torch.nn.Module) -> list[torch.Tensor]:
        optimizer = make_optimizer(model)
        shared = shared_for(rank, group, optimizer, tmp_path)
        model.register_forward_pre_hook(shared.attach_grads)
        for step in range(STEPS):
            model(xs[rank, step] * 3).pow(2).mean().backward()  # thrown away, as after a skipped step
            optimizer.zero_grad(set_to_none=True)
            model(xs[rank, step]).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in model.parameters()]

    want, _ = reference(1e9, xs)
    for weights in run_ranks(rank_body):
        for got, expected in zip(weights, want):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-7)


def test_state_dict_holds_private_copies_and_a_loaded_state_is_taken_in(tmp_path):
    xs = batches()

    def rank_body(rank: int, group: Group, model: torch.nn.Module) -> tuple[bool, bool, bool]:
        optimizer = make_optimizer(model)
        shared = shared_for(rank, group, optimizer, tmp_path)
        model(xs[rank, 0]).pow(2).mean().backward()
        optimizer.step()
        saved = optimizer.state_dict()
        moments = [s["exp_avg"] for s in saved["state"].values()]
        private = all(m.untyped_storage().data_ptr() != shared.exp_avg.untyped_storage().data_ptr() for m in moments)
        equal = torch.equal(torch.cat([m.reshape(-1) for m in moments]), shared.exp_avg)
        group.barrier()
        doubled = {**saved, "state": {k: {**v, "exp_avg": v["exp_avg"] * 2} for k, v in saved["state"].items()}}
        optimizer.load_state_dict(doubled)  # collective: every rank loads, as a resume does
        taken = torch.equal(shared.exp_avg, torch.cat([m.reshape(-1) for m in moments]) * 2)
        return private, equal, taken

    assert run_ranks(rank_body) == [(True, True, True)] * WORLD


def test_unsupported_names_each_reason():
    model = make_model()
    fused = make_optimizer(model)
    room = lambda: 1 << 40  # noqa: E731

    def why(opt=fused, m=model, world=2, local=2, ipex=False, free=room, named="") -> str:
        return unsupported(opt, m, world=world, local_world=local, use_ipex=ipex, named=named, free_bytes=free)

    assert why() == ""
    assert why(named="--backend ccl") == "--backend ccl was asked for, which works on DDP's gradients"
    assert why(world=1) == "single process"
    assert why(local=1) == "ranks on more than one host"
    assert "IPEX" in why(ipex=True)
    assert "fused AdamW" in why(opt=torch.optim.AdamW(model.parameters()))
    assert "fused AdamW" in why(opt=torch.optim.SGD(model.parameters(), lr=0.1))
    assert "amsgrad" in why(opt=torch.optim.AdamW(model.parameters(), fused=True, amsgrad=True))
    bn = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
    assert "running statistics" in why(opt=make_optimizer(bn), m=bn)
    need = shm_bytes(sum(p.numel() for p in model.parameters()), 2)
    line = why(free=lambda: need // 2)
    assert "MiB free" in line and "--shm-size" in line


def test_decide_refuses_an_explicit_request_it_cannot_run_in_one_line():
    assert decide("off", "").name == "off"
    assert decide("auto", "").name == "shm"
    assert decide("shm", "").name == "shm"
    off = decide("auto", "ranks on more than one host")
    assert (off.name, off.reason) == ("off", "ranks on more than one host")
    with pytest.raises(CoreCPUError) as err:
        decide("shm", "ranks on more than one host")
    assert "\n" not in str(err.value) and "--shard-optimizer off" in str(err.value)


def test_a_run_resumed_from_its_state_dict_takes_the_same_steps(tmp_path):
    xs = batches()
    half = STEPS // 2

    def rank_body(rank: int, group: Group, model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        optimizer = make_optimizer(model)
        shared = shared_for(rank, group, optimizer, tmp_path / "a")
        model.register_forward_pre_hook(shared.attach_grads)
        saved = None
        for step in range(STEPS):
            if step == half:
                saved = ({k: v.clone() for k, v in model.state_dict().items()}, optimizer.state_dict())
            model(xs[rank, step]).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        straight = [p.detach().clone() for p in model.parameters()]
        group.barrier()
        # As a resume does: a fresh model and optimizer load the checkpoint before the shared step is made.
        fresh = make_model()  # its weights: the checkpoint's, loaded next
        fresh.load_state_dict(saved[0])
        opt2 = make_optimizer(fresh)
        opt2.load_state_dict(saved[1])
        shared2 = shared_for(rank, group, opt2, tmp_path / "b")
        fresh.register_forward_pre_hook(shared2.attach_grads)
        for step in range(half, STEPS):
            fresh(xs[rank, step]).pow(2).mean().backward()
            opt2.step()
            opt2.zero_grad(set_to_none=True)
        return straight, [p.detach().clone() for p in fresh.parameters()]

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for straight, resumed in run_ranks(rank_body):
        for a, b in zip(straight, resumed):
            assert torch.equal(a, b)


def test_a_ddp_choice_made_by_name_keeps_ddp_under_auto():
    from corecpu.training.run_options import RunOptions

    assert RunOptions().named_ddp_choice() == ""
    assert RunOptions(sparse_embedding_allreduce="off").named_ddp_choice() == ""
    assert RunOptions(backend="ccl").named_ddp_choice() == "--backend ccl"
    assert RunOptions(allreduce="mpi").named_ddp_choice() == "--allreduce mpi"
    assert RunOptions(allreduce_dtype="bf16").named_ddp_choice() == "--allreduce-dtype bf16"
    assert RunOptions(sparse_embedding_allreduce="on").named_ddp_choice() == "--sparse-embedding-allreduce on"
    assert RunOptions(grad_clip="torch").named_ddp_choice() == "--grad-clip torch"


def test_a_loaded_state_whose_parameters_stepped_unequally_keeps_each_ones_bias_correction(tmp_path):
    xs = batches()
    model0 = make_model()
    optimizer0 = make_optimizer(model0)
    model0(xs[0, 0]).pow(2).mean().backward()
    model0[2].bias.grad = None  # this parameter sits the first step out: its step stays behind the others'
    optimizer0.step()
    saved = optimizer0.state_dict()
    weights = {k: v.clone() for k, v in model0.state_dict().items()}

    def continued(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
        model(xs[rank, 1]).pow(2).mean().backward()

    # DDP's arithmetic: the mean of both ranks' second-step gradients, torch's fused AdamW with per-parameter steps.
    ref = make_model()
    ref.load_state_dict(weights)
    ref_opt = make_optimizer(ref)
    ref_opt.load_state_dict(copy.deepcopy(saved))  # load_state_dict keeps the tensors it is given
    grads = []
    for rank in range(WORLD):
        ref.zero_grad(set_to_none=True)
        continued(ref, ref_opt, rank)
        grads.append([p.grad.clone() for p in ref.parameters()])
    for p, *gs in zip(ref.parameters(), *grads):
        p.grad = sum(gs) / WORLD
    ref_opt.step()

    def rank_body(rank: int, group: Group, model: torch.nn.Module) -> list[torch.Tensor]:
        model.load_state_dict(weights)
        optimizer = make_optimizer(model)
        optimizer.load_state_dict(copy.deepcopy(saved))
        shared = shared_for(rank, group, optimizer, tmp_path)
        model.register_forward_pre_hook(shared.attach_grads)
        continued(model, optimizer, rank)
        optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    for weights_after in run_ranks(rank_body):
        for got, expected in zip(weights_after, ref.parameters()):
            torch.testing.assert_close(got, expected.detach(), rtol=2e-6, atol=2e-7)
