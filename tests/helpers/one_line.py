"""The check behind every bad-input test: a CoreCPUError of one line that holds what it must name."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from corecpu.errors import CoreCPUError


def one_line_error(call: Callable[[], Any], *needles: str) -> str:
    with pytest.raises(CoreCPUError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message
