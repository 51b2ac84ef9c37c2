"""Lifetime.close: the closers last-registered first, then the teardown, once."""

from corecpu.training.lifetime import Lifetime


class Store:
    """Stands for the rendezvous store."""


def test_close_runs_closers_in_reverse_then_teardown_once():
    order = []
    life = Lifetime(Store())
    life.on_close(lambda: order.append("first"))
    life.on_close(lambda: order.append("second"))
    life.close(teardown=lambda: order.append("teardown"))
    life.close(teardown=lambda: order.append("again"))
    assert order == ["second", "first", "teardown"] and life.closed and life.store is None
