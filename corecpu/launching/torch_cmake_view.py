"""A CPU-only view of a CUDA torch wheel's CMake package, so the oneCCL bindings build against it.

PyPI's torch 2.8.0 for Linux x86-64 is a CUDA build, and IPEX 2.8 needs exactly that torch. Its CMake
package (`torch/share/cmake`) insists on finding the CUDA toolkit (headers, nvrtc) before anything can link
to torch, although the bindings use no CUDA at all. The view is a copy of that package in which the two
CUDA blocks are switched off and the `torch::cudart` target the Caffe2 targets name is an empty interface;
`include/` and `lib/` are links to the wheel's own, so the build compiles and links against the very files
the environment runs with. Nothing in the environment is changed.

CMake finds the view first through `Torch_ROOT` and `Caffe2_ROOT` (searched before the CMAKE_PREFIX_PATH
the bindings' setup.py passes). A CPU build of torch (2.13.0+cpu, say) needs no view.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

from corecpu.errors import CoreCPUError

# In Caffe2Config.cmake: the block that includes public/cuda.cmake and fails without a toolkit.
_CAFFE2_CUDA = re.compile(r"^if\(ON\)\n((?:[ \t]*#[^\n]*\n)*[ \t]*set\(CAFFE2_USE_CUDA ON\))", re.M)
# In TorchConfig.cmake: the block that adds nvrtc and c10_cuda to TORCH_LIBRARIES.
_TORCH_CUDA = re.compile(r"^if\(ON\)\n((?:[ \t]*[^\n]*\n){0,3}[^\n]*CAFFE2_NVRTC_LIBRARY)", re.M)
_CUDART_STUB = ("if(NOT TARGET torch::cudart)\n"
                "  add_library(torch::cudart INTERFACE IMPORTED)  # corecpu: CPU-only view, see torch_cmake_view.py\n"
                "endif()\n")


def is_cuda_build(caffe2_config: str) -> bool:
    """Pure: whether torch's Caffe2Config.cmake will look for the CUDA toolkit."""
    return _CAFFE2_CUDA.search(caffe2_config) is not None


def cpu_only(caffe2_config: str, torch_config: str) -> tuple[str, str]:
    """Pure: both files with their CUDA blocks switched off. An unknown layout is an error, never a guess."""
    caffe2, n1 = _CAFFE2_CUDA.subn(lambda m: _CUDART_STUB + "if(OFF)\n" + m.group(1), caffe2_config, count=1)
    torch_, n2 = _TORCH_CUDA.subn(lambda m: "if(OFF)\n" + m.group(1), torch_config, count=1)
    if not (n1 and n2):
        raise CoreCPUError("this torch's CMake package needs CUDA in a way build-ccl does not recognise; build the "
                           "bindings against a CPU build of torch (pip install torch --index-url "
                           "https://download.pytorch.org/whl/cpu)")
    return caffe2, torch_


def torch_dir() -> Path:
    """The installed torch package's directory, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise CoreCPUError("torch is not installed in this environment; install corecpu first")
    return Path(next(iter(spec.submodule_search_locations)))


def make_view(torch_root: Path, dest: Path) -> Path | None:
    """A CPU-only view of `torch_root`'s CMake package in `dest`, or None when torch is a CPU build."""
    cmake = torch_root / "share" / "cmake"
    caffe2_path, torch_path = cmake / "Caffe2" / "Caffe2Config.cmake", cmake / "Torch" / "TorchConfig.cmake"
    if not caffe2_path.exists() or not torch_path.exists():
        raise CoreCPUError(f"torch at {torch_root} has no CMake package (share/cmake); reinstall torch from PyPI")
    caffe2_text = caffe2_path.read_text()
    if not is_cuda_build(caffe2_text):
        return None
    caffe2_text, torch_text = cpu_only(caffe2_text, torch_path.read_text())
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(cmake, dest / "share" / "cmake")
    # TorchConfig finds headers and libraries from its own location: ../../../include and lib.
    for name in ("include", "lib"):
        (dest / name).symlink_to(torch_root / name, target_is_directory=True)
    (dest / "share" / "cmake" / "Caffe2" / "Caffe2Config.cmake").write_text(caffe2_text)
    (dest / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text(torch_text)
    return dest


def view_env(view: Path) -> dict[str, str]:
    """Pure: what makes CMake's find_package(Torch) (and its Caffe2) take the view."""
    return {"Torch_ROOT": str(view), "Caffe2_ROOT": str(view)}


__all__ = ["cpu_only", "is_cuda_build", "make_view", "torch_dir", "view_env"]
