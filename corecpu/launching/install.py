"""Which torch build an environment holds, read without importing torch (launch.sh asks).

On Linux, PyPI's torch wheel is the CUDA build: it runs on CPU, but pulls several GB of
nvidia-* libraries a CPU cluster never uses. PyTorch's own index has the CPU build:
https://download.pytorch.org/whl/cpu (launch.sh passes $CORECPU_TORCH_INDEX to pip).

    python -m corecpu.install torch-cuda    # prints the CUDA version of the installed torch, or nothing
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

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
    if args[:1] == ["torch-cuda"]:
        print(torch_cuda_version() or "")
        return 0
    if args[:1] == ["cuda-notice"] and len(args) == 2:
        notice = cuda_build_notice(torch_cuda_version(), args[1])
        if notice:
            print(notice)
        return 0
    print("usage: python -m corecpu.install torch-cuda | cuda-notice ENV_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
