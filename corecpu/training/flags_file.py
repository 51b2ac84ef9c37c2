"""`--config FILE`: a YAML or JSON mapping whose keys are train.py's flags (`batch_size` or `batch-size`).

The file only changes the defaults: a flag on the command line still wins. A run's own config.json
reads back as it is: besides the flags it records `resolved` and `decisions`, what the run's `auto`
settings came to and why. Those are outputs, so they are skipped; the new run decides again (pass
e.g. `--precision bf16` to repeat a choice). Any other key is an error, as a misspelt flag is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from corecpu.errors import CoreCPUError

RECORDED = ("resolved", "decisions")  # what config.json adds to the flags; not settings
TYPES = {"int": int, "float": float, "str": str, "bool": bool}
SAY = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false"}


def _load(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CoreCPUError(f"--config {path}: cannot read it ({exc.strerror}); pass a YAML or JSON file") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml  # optional (the test extra): JSON needs nothing
        except ImportError:
            raise CoreCPUError(f"--config {path}: reading YAML needs pyyaml; pip install pyyaml, or use JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f" at line {where.line + 1}" if where else ""
            raise CoreCPUError(f"--config {path}: not valid YAML{line}; fix the file") from None
    if path.suffix.lower() != ".json":
        raise CoreCPUError(f"--config {path}: unknown file type {path.suffix or '(none)'}; use .yaml, .yml or .json")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CoreCPUError(f"--config {path}: not valid JSON at line {exc.lineno}: {exc.msg}; fix the file") from None


def _check(path: Path, key: str, value: Any, kind: str) -> Any:
    want = TYPES[kind]
    # JSON and YAML have one number type for 3 and 3.0; bool is an int in Python but not a number here.
    ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise CoreCPUError(f"--config {path}: {key} must be {SAY[kind]}, got {value!r}; fix it in the file")
    return value


def read_config_file(path: str | Path, fields: Mapping[str, str]) -> dict[str, Any]:
    """{field: value} from the file, type-checked against `fields` ({name: "int"|"float"|"str"|"bool"})."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict):
        raise CoreCPUError(f"--config {path}: expected a mapping of flag names to values, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for raw, value in data.items():
        key = str(raw).removeprefix("--").replace("-", "_")
        if key in RECORDED:
            continue
        if key not in fields:
            raise CoreCPUError(f"--config {path}: unknown key {raw!r}; keys are train.py's flags without '--' "
                               "(python train.py --help)")
        out[key] = _check(path, str(raw), value, fields[key])
    return out
