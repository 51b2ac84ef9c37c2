"""Lifetime.close: the closers last-registered first, then the teardown; the store destroyed at close, by a full
garbage collection (0.2 s with transformers loaded) only when something still holds it."""

import gc

from corecpu.training.lifetime import Lifetime


class Store:
    """Stands for the rendezvous store (weak-referenceable, as torch's is)."""


def test_close_runs_closers_in_reverse_then_teardown_once(monkeypatch):
    order = []
    life = Lifetime(Store())
    life.on_close(lambda: order.append("first"))
    life.on_close(lambda: order.append("second"))
    life.close(teardown=lambda: order.append("teardown"))
    life.close(teardown=lambda: order.append("again"))
    assert order == ["second", "first", "teardown"] and life.closed and life.store is None


def test_a_store_nobody_else_holds_goes_without_a_full_collection(monkeypatch):
    collections = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(a) or 0)
    Lifetime(Store()).close(teardown=lambda: None)
    assert collections == []

    held = Store()  # a thread or an object still holding it: collect, as before, for what a cycle keeps
    Lifetime(held).close(teardown=lambda: None)
    assert collections == [()]
