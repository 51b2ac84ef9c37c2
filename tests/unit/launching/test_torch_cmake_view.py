"""The CPU-only view of a CUDA torch wheel's CMake package (build-ccl against PyPI's torch 2.8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corecpu.errors import CoreCPUError
from corecpu.launching.torch_cmake_view import cpu_only, is_cuda_build, make_view, view_env

# The shape of torch 2.8.0's files (PyPI, CUDA 12.8): only the parts the view changes, and neighbours.
CAFFE2 = """if (OFF)
  include("${CMAKE_CURRENT_LIST_DIR}/public/LoadHIP.cmake")
endif()

if(ON)
  # The file public/cuda.cmake exclusively uses CAFFE2_USE_*.
  # If Caffe2 was compiled with the libraries below, they must
  # be found again when including the Caffe2 target.
  set(CAFFE2_USE_CUDA ON)
  include("${CMAKE_CURRENT_LIST_DIR}/public/cuda.cmake")
endif()

if(ON)
  append_torchlib_if_found(sleef asmjit)
endif()
"""
TORCH = """if(ON)
  if(MSVC)
    find_library(CAFFE2_NVRTC_LIBRARY caffe2_nvrtc PATHS "${TORCH_INSTALL_PREFIX}/lib")
  endif()
endif()

if(ON)
  append_torchlib_if_found(kineto)
endif()
"""
CPU_CAFFE2 = CAFFE2.replace("if(ON)\n  # The file", "if(OFF)\n  # The file")  # what a +cpu wheel has


def test_a_cuda_package_gets_both_cuda_blocks_off_and_an_empty_cudart_target() -> None:
    assert is_cuda_build(CAFFE2) and not is_cuda_build(CPU_CAFFE2)
    caffe2, torch = cpu_only(CAFFE2, TORCH)
    assert "add_library(torch::cudart INTERFACE IMPORTED)" in caffe2
    assert "if(OFF)\n  # The file public/cuda.cmake" in caffe2 and not is_cuda_build(caffe2)
    assert "if(OFF)\n  if(MSVC)\n    find_library(CAFFE2_NVRTC_LIBRARY" in torch
    # Everything else stays as it was: the CPU libraries are still found.
    assert caffe2.count("if(ON)\n  append_torchlib_if_found(sleef asmjit)") == 1
    assert "if(ON)\n  append_torchlib_if_found(kineto)" in torch


def test_an_unknown_layout_is_an_error_not_a_guess() -> None:
    with pytest.raises(CoreCPUError, match="CPU build of torch"):
        cpu_only(CAFFE2, "if(ON)\n  set(SOMETHING_NEW ON)\nendif()\n")


def _fake_torch(root: Path, caffe2: str) -> Path:
    for rel, text in (("share/cmake/Caffe2/Caffe2Config.cmake", caffe2), ("share/cmake/Torch/TorchConfig.cmake", TORCH),
                      ("share/cmake/Caffe2/Caffe2Targets.cmake", "# targets\n"), ("include/torch/x.h", ""),
                      ("lib/libtorch.so", "")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_view_links_the_wheels_own_headers_and_libraries(tmp_path) -> None:
    torch = _fake_torch(tmp_path / "torch", CAFFE2)
    view = make_view(torch, tmp_path / "view")
    assert view == tmp_path / "view"
    assert (view / "include").resolve() == (torch / "include").resolve()
    assert (view / "lib" / "libtorch.so").resolve() == (torch / "lib" / "libtorch.so").resolve()
    assert (view / "share/cmake/Caffe2/Caffe2Targets.cmake").read_text() == "# targets\n"
    assert not is_cuda_build((view / "share/cmake/Caffe2/Caffe2Config.cmake").read_text())
    assert is_cuda_build((torch / "share/cmake/Caffe2/Caffe2Config.cmake").read_text())  # the wheel is untouched
    assert view_env(view) == {"Torch_ROOT": str(view), "Caffe2_ROOT": str(view)}
    assert make_view(torch, tmp_path / "view") == view  # made again over an old one


def test_a_cpu_build_needs_no_view_and_a_torch_without_cmake_is_an_error(tmp_path) -> None:
    assert make_view(_fake_torch(tmp_path / "cpu", CPU_CAFFE2), tmp_path / "view") is None
    assert not (tmp_path / "view").exists()
    with pytest.raises(CoreCPUError, match="no CMake package"):
        make_view(tmp_path / "empty", tmp_path / "view")
