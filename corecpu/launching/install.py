"""Where launch.sh's first install takes torch from, and which torch build an environment holds.

On Linux, PyPI's torch wheel is the CUDA build: it runs on CPU, but pulls several GB of
nvidia-* libraries a CPU cluster never uses. PyTorch's own index has the CPU build:
https://download.pytorch.org/whl/cpu. launch.sh's first install adds it as an extra index (the
other packages still come from PyPI) with torch pinned by constraints.txt, so pip's newest
match is 2.13.0+cpu. It leaves pip alone when the user chose: their own index settings
(PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX or pip's config files), an
environment that already has torch, or CORECPU_TORCH_INDEX (a URL, a directory of wheels, or
empty for none).

    python -m corecpu.install first-install CONSTRAINTS   # launch.sh: a line saying what, then pip's words
    python -m corecpu.install torch-cuda    # prints the CUDA version of the installed torch, or nothing

launch.sh runs this from the checkout (PYTHONPATH) before corecpu is installed: like the rest of
corecpu.launching it needs only the standard library.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from corecpu.envvars import TORCH_INDEX

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip's own ways to say where packages come from, as environment variables and as `pip config list` keys.
USER_INDEX_VARS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")
USER_INDEX_KEYS = re.compile(r"^[\w:.-]*\.(index-url|extra-index-url|find-links|no-index)=", re.M)


def torch_source(environ: Mapping[str, str], has_torch: bool, pip_config: str, constraints: str,
                 cpu_index: str = CPU_INDEX, is_dir: Callable[[str], bool] = os.path.isdir) -> tuple[str, list[str]]:
    """Pure: (what the first install does about torch, in words; pip's arguments for it)."""
    # An environment with torch keeps it (e.g. torch 2.8 for IPEX 2.8: corecpu takes any torch >= 2.8): no pin.
    pin = [] if has_torch else ["-c", constraints]
    kept = "keeps the torch this environment already has"
    chosen = environ.get(TORCH_INDEX, "").strip()
    if chosen:  # asked for by name: passed on even beside the user's own index or torch
        if "://" not in chosen and is_dir(chosen):
            return kept if has_torch else f"torch from the wheels in {chosen} ({TORCH_INDEX})", \
                [*pin, "--find-links", chosen]
        return kept if has_torch else f"torch from {chosen} ({TORCH_INDEX}), the rest from pip's index", \
            [*pin, "--extra-index-url", chosen]
    if has_torch:
        return kept, []
    if TORCH_INDEX in environ:
        return f"torch from pip's own index settings ({TORCH_INDEX} is empty: no CPU index added)", pin
    user = [v for v in USER_INDEX_VARS if environ.get(v)]
    if user or USER_INDEX_KEYS.search(pip_config):
        where = ", ".join(user) if user else "pip's config"
        return (f"torch from your pip index settings ({where}); {TORCH_INDEX}={cpu_index} adds PyTorch's CPU "
                "index to them"), pin
    return (f"the CPU build of torch (2.13.0+cpu) from PyTorch's CPU index {cpu_index}, the rest from PyPI "
            f"({TORCH_INDEX}= to turn the CPU index off)"), [*pin, "--extra-index-url", cpu_index]


def pip_config_list() -> str:
    """`pip config list` of this interpreter (its config files' settings), or "" when pip cannot say."""
    try:
        return subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""

_CUDA_LINE = re.compile(r"""^cuda\s*(?::[^=]+)?=\s*['"]([^'"]+)['"]""", re.M)


def cuda_of_version_file(text: str) -> str | None:
    """Pure: the `cuda = '12.8'` of torch/version.py; None for a CPU build (`cuda = None`)."""
    m = _CUDA_LINE.search(text)
    return m.group(1) if m else None


def torch_cuda_version(find_spec: Callable = importlib.util.find_spec) -> str | None:
    """CUDA version of the torch this interpreter would import; None for a CPU build or no torch."""
    spec = find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            return cuda_of_version_file((Path(location) / "version.py").read_text())
        except OSError:
            continue
    return None


def cuda_build_notice(cuda: str | None, env_dir: str) -> str | None:
    """Pure: the one-line notice launch.sh prints for a CUDA build, or None."""
    if cuda is None:
        return None
    return (f"torch in {env_dir} is the CUDA {cuda} build: it works on CPU but its nvidia libraries take GBs; "
            f"for the CPU build: pip install --force-reinstall -c constraints.txt torch --index-url {CPU_INDEX}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["first-install"] and len(args) == 2:
        has_torch = importlib.util.find_spec("torch") is not None
        how, words = torch_source(os.environ, has_torch, "" if has_torch else pip_config_list(), args[1])
        print("\n".join([how, *words]))
        return 0
    if args[:1] == ["torch-cuda"]:
        print(torch_cuda_version() or "")
        return 0
    if args[:1] == ["cuda-notice"] and len(args) == 2:
        notice = cuda_build_notice(torch_cuda_version(), args[1])
        if notice:
            print(notice)
        return 0
    print("usage: python -m corecpu.install first-install CONSTRAINTS | torch-cuda | cuda-notice ENV_DIR",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
