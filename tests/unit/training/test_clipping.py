"""Tier 1: run.clip_grad_norm_'s clipper (corecpu.training.clipping) gives torch.nn.utils.clip_grad_norm_'s norm and
training, whether it folds the scale into the fused AdamW's step or multiplies in place. (The embedding's norm from
sparse_rows' reduced rows needs ranks: tests/multiprocess/test_sparse_rows.py.)"""

from __future__ import annotations

import pytest
import torch

from corecpu.training.clipping import BY_ROWS_FROM, GradientClipper, folds_into, total_norm


def params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in ((300, 24), (24,), (7, 5, 3))]


def set_grads(ps: list[torch.nn.Parameter], step: int) -> None:
    g = torch.Generator().manual_seed(step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * (step + 1)


def train(clip: str, max_norm: float, fused: bool = True, steps: int = 4) -> tuple[list[torch.Tensor], list[float]]:
    ps = params()
    opt = torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01, fused=fused)
    clipper = GradientClipper(ps, opt)
    norms = []
    for step in range(steps):
        set_grads(ps, step)
        if clip == "torch":
            norms.append(float(torch.nn.utils.clip_grad_norm_(ps, max_norm)))
        else:
            norms.append(float(clipper(max_norm)))
            # Under the limit there is nothing to scale: no grad_scale, and no multiply either.
            assert clipper.folded == (fused and clip == "corecpu" and norms[-1] > max_norm)
        opt.step()
        assert not hasattr(opt, "grad_scale")  # the post-step hook took the scale away
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in ps], norms


@pytest.mark.parametrize("max_norm", [0.5, 1e6], ids=["clipping", "not-clipping"])
def test_folded_into_fused_adamw_trains_like_torchs_clip(max_norm):
    ours, our_norms = train("corecpu", max_norm)
    theirs, their_norms = train("torch", max_norm)
    assert our_norms == their_norms  # the same norm, computed the same way
    assert min(our_norms) > 0.5  # so the first case really clips every step
    for a, b in zip(ours, theirs):
        # g / (1/c) inside the kernel against g * c before it: a rounding apart, no more.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if max_norm > max(our_norms):  # never clipping: torch's multiply by 1 left every bit, and so did no scale
            assert torch.equal(a, b)
    assert any(not torch.equal(a, p) for a, p in zip(ours, params()))  # and it trained


def test_without_the_fused_kernel_it_is_torchs_clip_bit_for_bit():
    assert not folds_into(torch.optim.AdamW(params(), fused=False))
    ours, our_norms = train("corecpu", 0.5, fused=False)
    theirs, their_norms = train("torch", 0.5, fused=False)
    assert our_norms == their_norms
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_clipped_gradients_are_what_torch_leaves_once_the_step_has_run():
    ps, ref = params(), params()
    opt = torch.optim.AdamW(ps, lr=1e-2, fused=True)
    clipper = GradientClipper(ps, opt)
    set_grads(ps, 3)
    set_grads(ref, 3)
    clipper(0.5)
    assert clipper.folded and all(torch.equal(p.grad, r.grad) for p, r in zip(ps, ref))  # not yet scaled
    opt.step()
    torch.nn.utils.clip_grad_norm_(ref, 0.5)
    for p, r in zip(ps, ref):  # the fused kernel wrote the divided gradients back
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-7)


def test_gradients_the_optimizer_does_not_update_are_clipped_in_place():
    ps = params()
    opt = torch.optim.AdamW(ps[:2], lr=1e-2, fused=True)  # the third parameter is not the optimizer's
    clipper = GradientClipper(ps, opt)
    set_grads(ps, 2)
    before = [p.grad.clone() for p in ps]
    norm = clipper(0.5)
    assert not clipper.folded and not hasattr(opt, "grad_scale")
    coefficient = 0.5 / (norm + 1e-6)
    for p, b in zip(ps, before):
        torch.testing.assert_close(p.grad, b * coefficient)


def test_fold_false_and_a_gradscalers_scale_clip_in_place():
    ps = params()
    opt = torch.optim.AdamW(ps, lr=1e-2, fused=True)
    clipper = GradientClipper(ps, opt)
    set_grads(ps, 1)
    clipper(0.5, fold=False)
    assert not clipper.folded and not hasattr(opt, "grad_scale")
    assert float(torch.nn.utils.get_total_norm([p.grad for p in ps])) == pytest.approx(0.5, rel=1e-5)
    opt.grad_scale = torch.tensor(1.0)  # someone else's (a GradScaler's): not ours to replace
    assert not folds_into(opt)


def test_no_gradients_give_a_zero_norm_and_touch_nothing():
    ps = params()
    opt = torch.optim.AdamW(ps, lr=1e-2, fused=True)
    assert float(GradientClipper(ps, opt)(1.0)) == 0.0
    assert not hasattr(opt, "grad_scale")


def test_an_unknown_kernel_is_one_clear_error():
    from corecpu.errors import CoreCPUError

    with pytest.raises(CoreCPUError, match="grad_clip must be one of fused, torch, got 'fast'"):
        GradientClipper(params(), None, kernel="fast")


def test_a_non_finite_norm_is_applied_as_torch_applies_it():
    ps, ref = params(), params()
    for group in (ps, ref):
        set_grads(group, 1)
        group[0].grad[0, 0] = float("nan")
    clipper = GradientClipper(ps, torch.optim.AdamW(ps, fused=False))
    assert torch.isnan(clipper(1.0)) and torch.isnan(torch.nn.utils.clip_grad_norm_(ref, 1.0))
    for p, r in zip(ps, ref):  # a NaN coefficient is not 1: multiplied in, as torch does (every gradient NaN)
        assert torch.equal(p.grad.isnan(), r.grad.isnan()) and bool(p.grad.isnan().all())


def test_total_norm_of_small_tensors_is_torchs_bit_for_bit() -> None:
    ts = [p.detach() * 3 for p in params()]
    assert torch.equal(total_norm(ts), torch.nn.utils.get_total_norm(ts))
    assert float(total_norm([])) == 0.0


def test_total_norm_by_rows_is_exact_tail_included_and_the_same_on_any_thread_count() -> None:
    g = torch.Generator().manual_seed(4)
    embedding = torch.randn(30522, 96, generator=g)  # 2.9M elements in one tensor: torch sums them in one chain
    tailed = torch.randn(BY_ROWS_FROM + 1000, generator=g)
    tailed[-(tailed.numel() % 4096):] = 100.0  # the part past the last whole row carries most of the norm
    small = torch.randn(768, generator=g)
    ts = [embedding, tailed, small, torch.randn(96, 3072, generator=g).to(torch.bfloat16)]
    truth = torch.linalg.vector_norm(torch.cat([t.double().reshape(-1) for t in ts]))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = total_norm(ts)
        torch.set_num_threads(2)
        two = total_norm(ts)
    finally:
        torch.set_num_threads(threads)
    assert one.dtype == torch.float32 and torch.equal(one, two)
    assert abs(float(one) - float(truth)) / float(truth) < 2e-6
    only_large = total_norm([embedding])  # no small tensor at all
    assert abs(float(only_large) - float(torch.linalg.vector_norm(embedding.double()))) < 2e-6 * float(only_large)
