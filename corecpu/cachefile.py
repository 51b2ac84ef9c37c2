"""One small JSON file of measured results by key, under corecpu's cache directory, written atomically.

The precision calibration (precision.json) and the all-reduce timing (allreduce.json) keep their
measurements here. A missing, unreadable, corrupt or older-version file reads as empty and is
rewritten by the next store; an unwritable directory warns once per file and host (corecpu.notices) and the
value is simply measured again next run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corecpu import atomic, envvars, notices
from corecpu.errors import os_problem

_warned: set[Path] = set()


def read_entries(path: Path, version: int) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != version or not isinstance(data.get("entries"), dict):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}


def store_entry(path: Path, version: int, key: str, entry: dict[str, Any], what: str) -> bool:
    """Add one entry (corecpu.atomic: a temporary renamed over the file). `what` names the measurement in
    the one warning an unwritable directory gets. Returns whether it was stored."""
    entries = read_entries(path, version)
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path, {"version": version, "entries": entries}, indent=2, sort_keys=True)
    except OSError as exc:
        if path not in _warned:
            _warned.add(path)
            notices.warn(f"not caching {what} in {path.parent} ({os_problem(exc, path)}); it will be measured "
                         f"again next run (or set {envvars.CACHE_DIR} to a writable directory)", per_host=True)
        return False
    return True


__all__ = ["read_entries", "store_entry"]
