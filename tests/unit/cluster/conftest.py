"""Fixtures the cluster tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def crds():
    """helpers.crds (validation against the operators' real CRDs), where the test extra (pyyaml, jsonschema) is installed."""
    pytest.importorskip("yaml")
    pytest.importorskip("jsonschema")
    from helpers import crds

    return crds
