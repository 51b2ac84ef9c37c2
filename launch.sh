#!/usr/bin/env bash
# Run train.py (or your own SCRIPT.py) on N ranks through Intel MPI's mpirun (or torchrun
# when no mpirun exists).
#
#   ./launch.sh 2                           # 2 ranks on this host, the built-in job
#   ./launch.sh 4 --model tiny --max-steps 50
#   ./launch.sh 2 my_loop.py --my-args      # your own loop on corecpu.setup(), same binding
#   ./launch.sh 8 -f hosts --ppn 4 --data train.tsv
#   ./launch.sh 2 --dry-run                 # print the command, environment and plan; run nothing
#   ./launch.sh --with-ccl [2 --backend ccl] # first build the oneCCL bindings (corecpu build-ccl; cached)
#
# First use creates .venv (unless a virtualenv is active) and installs corecpu with
# torch pinned by constraints.txt. Each rank is bound to its own cores by
# `python -m corecpu.bind` before torch starts, from a plan each node makes for itself.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "launch.sh: error: $*" >&2; exit 2; }
warn() { echo "launch.sh: warning: $*" >&2; }

usage() {
  cat <<'EOF'
usage: ./launch.sh [--with-ccl] N [-f HOSTFILE] [--ppn P] [--dry-run] [--launcher mpirun|torchrun] [--log-dir DIR] [SCRIPT.py] [args...]
  --with-ccl     first build and install the oneCCL bindings for --backend ccl (corecpu build-ccl; a cached
                 build installs in seconds); alone, it only does that
  N              total number of ranks (processes)
  -f HOSTFILE    spread ranks over the hosts in HOSTFILE (one per line) with mpirun; rank 0's host first
  --ppn P        ranks per host with -f (default: N divided evenly over the hosts)
  --dry-run      print the launch command, its environment and this host's plan; run nothing
  --launcher L   force mpirun or torchrun (default: mpirun if found, else torchrun)
  --log-dir DIR  each rank's stdout and stderr to DIR/rank-N.log; a failed job prints the failed ranks' last lines
  SCRIPT.py      a first argument ending in .py is the script to run (default: train.py);
                 everything after it is the script's
Everything else goes to train.py (see: python train.py --help).
EOF
}

setup_only=0 extras="" with_ccl=0 ccl_only=0
if [[ "${1:-}" == --with-ccl ]]; then
  with_ccl=1; shift
  [[ $# -ge 1 ]] || { ccl_only=1; set -- 1; }
fi
[[ $# -ge 1 ]] || { usage >&2; exit 2; }
case "$1" in
  -h|--help) usage; exit 0 ;;
  # used by test.sh: prepare the environment (with the extras named, e.g. test), print its python
  --setup-only) setup_only=1; extras="${2:-}"; set -- 1 ;;
esac
nranks_arg="$1"; shift
[[ "$nranks_arg" =~ ^-?[0-9]+$ ]] || die "N must be a whole number of ranks, got '$nranks_arg'; e.g. ./launch.sh 2"
(( nranks_arg >= 1 )) || die "N must be at least 1, got $nranks_arg; e.g. ./launch.sh 2"
dry_run=0
for a in "$@"; do [[ "$a" == --dry-run ]] && dry_run=1; [[ "$a" == *.py ]] && break; done

# ---------------------------------------------------------------- environment
# Use the active virtualenv (or conda env) if there is one; otherwise our own .venv.
if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py="$(command -v python)"
else
  py="$here/.venv/bin/python"
fi
stamp_of() { cat "$here/pyproject.toml" "$here/constraints.txt" | cksum | cut -d' ' -f1; }
stamp_file="$(dirname "$py")/../.corecpu-installed"
# The stamp holds the checksum of what was installed and the extras installed with it.
stamp_sum="" stamp_extras=""
[[ -f "$stamp_file" ]] && read -r stamp_sum stamp_extras < "$stamp_file" || true
if [[ "${stamp_sum:-}" != "$(stamp_of)" || ( -n "$extras" && ",${stamp_extras:-}," != *",$extras,"* ) ]]; then
  # mpi (Intel MPI's mpirun, mpi4py), demo (the default model) and lora (peft) always: the README's commands
  # need them.
  target="$here[mpi,demo,lora${extras:+,$extras}]"
  if (( dry_run )); then
    echo "# would first set up $(dirname "$(dirname "$py")") and pip install -c constraints.txt -e '$target'"
  else
    if [[ ! -x "$py" ]]; then
      echo "launch.sh: creating $here/.venv" >&2
      python3 -m venv "$here/.venv" || die "python3 -m venv failed; install python3-venv or activate a virtualenv first"
    fi
    # An environment that already has torch keeps it (e.g. torch 2.8 for IPEX 2.8): corecpu accepts
    # any torch >= 2.8, and the 2.13.0 pin is only there so a fresh install avoids the CUDA build.
    pin=(-c "$here/constraints.txt")
    "$py" -c 'import torch' 2>/dev/null && pin=()
    # PyPI's Linux torch is the CUDA build (GBs of nvidia libraries); CORECPU_TORCH_INDEX, e.g.
    # https://download.pytorch.org/whl/cpu, adds PyTorch's CPU index, whose 2.13.0+cpu pip then
    # prefers. pip's own PIP_EXTRA_INDEX_URL / PIP_INDEX_URL work as well.
    index=()
    [[ -n "${CORECPU_TORCH_INDEX:-}" ]] && index=(--extra-index-url "$CORECPU_TORCH_INDEX")
    echo "launch.sh: installing corecpu and its dependencies into $(dirname "$(dirname "$py")") (first run only)" >&2
    "$py" -m pip install -qq --disable-pip-version-check "${pin[@]}" "${index[@]}" -e "$target" >&2 \
      || die "pip install failed (see above); fix the error and run launch.sh again"
    echo "$(stamp_of) $extras" > "$stamp_file"
  fi
fi
# Say once per environment when its torch is a CUDA build: it works, but costs GBs.
cuda_noticed="$(dirname "$py")/../.corecpu-cuda-noticed"
if [[ ! -e "$cuda_noticed" ]] && (( ! dry_run )); then
  notice="$("$py" -m corecpu.install cuda-notice "$(dirname "$(dirname "$py")")" 2>/dev/null || true)"
  if [[ -n "$notice" ]]; then
    warn "$notice"
    touch "$cuda_noticed" 2>/dev/null || true
  fi
fi
bindir="$(dirname "$py")"
export PATH="$bindir:$PATH"
if (( with_ccl && ! dry_run )); then
  "$py" -m corecpu.cli build-ccl >&2 || exit $?  # it has said what went wrong, in one line
  (( ccl_only )) && exit 0
fi
if (( setup_only )); then echo "$py"; exit 0; fi

# ---------------------------------------------------------------- launch
# Hosts, port, binding and the mpirun/torchrun command are decided in corecpu/launch.py,
# the same code as `corecpu launch`.
exec "$py" -m corecpu.launch --default-script "$here/train.py" "$nranks_arg" "$@"
