"""Tier 1: a resume that would read the saved position under another batch layout is named
(corecpu.training.checkpoint_state.layout_change / approximate_position)."""

from __future__ import annotations

from corecpu.training.checkpoint_state import approximate_position, layout_change


def cfg(batch, accum=1):
    return {"batch_size": batch, "grad_accum": accum}


def test_same_examples_per_micro_batch_and_step_is_exact():
    assert layout_change(cfg(8), 2, cfg(8), 2) is None
    assert layout_change(cfg(8), 2, cfg(16), 1) is None  # 2 ranks x 8 -> 1 rank x 16: the same micro-batches
    assert layout_change(cfg(4, 2), 4, cfg(8, 2), 2) is None


def test_other_layouts_are_named():
    assert layout_change(cfg(8), 2, cfg(8), 1) == ("it was saved by 2 rank(s) x batch 8 x --grad-accum 1 and this run "
                                                   "is 1 rank(s) x batch 8 x --grad-accum 1")
    assert layout_change(cfg(16), 2, cfg(8), 2) is not None
    assert layout_change(cfg(8, 1), 2, cfg(8, 2), 1) is not None  # same global batch, other micro-batches


def test_configs_without_a_layout_are_not_compared():
    assert layout_change({}, 2, cfg(8), 1) is None


def test_approximate_position_says_how_far_off():
    assert "used 160 examples of its epoch; this run starts after 80, so about 80 are trained on a second time" in \
        approximate_position(cfg(8), 2, cfg(8), 1, 10)
    assert "about 160 are skipped without being trained on" in approximate_position(cfg(8), 2, cfg(16), 2, 10)
