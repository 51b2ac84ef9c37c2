#!/usr/bin/env bash
# Run train.py on N ranks through Intel MPI's mpirun (or torchrun when no mpirun exists).
#
#   ./launch.sh 2                           # 2 ranks on this host, the built-in job
#   ./launch.sh 4 --model tiny --max-steps 50
#   ./launch.sh 8 -f hosts --ppn 4 --data train.tsv
#   ./launch.sh 2 --dry-run                 # print the command, environment and plan; run nothing
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
usage: ./launch.sh N [-f HOSTFILE] [--ppn P] [--dry-run] [--launcher mpirun|torchrun] [train.py args...]
  N              total number of ranks (processes)
  -f HOSTFILE    spread ranks over the hosts in HOSTFILE (one per line) with mpirun; rank 0's host first
  --ppn P        ranks per host with -f (default: N divided evenly over the hosts)
  --dry-run      print the launch command, its environment and this host's plan; run nothing
  --launcher L   force mpirun or torchrun (default: mpirun if found, else torchrun)
Everything else goes to train.py (see: python train.py --help).
EOF
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
setup_only=0
case "$1" in
  -h|--help) usage; exit 0 ;;
  --setup-only) setup_only=1; set -- 1 ;;  # used by test.sh: prepare the environment, print its python
esac
nproc_arg="$1"; shift
[[ "$nproc_arg" =~ ^-?[0-9]+$ ]] || die "N must be a whole number of ranks, got '$nproc_arg'; e.g. ./launch.sh 2"
(( nproc_arg >= 1 )) || die "N must be at least 1, got $nproc_arg; e.g. ./launch.sh 2"
nranks=$nproc_arg

hostfile="" ppn="" dry_run=0 launcher="" train_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -f|--hostfile) [[ $# -ge 2 ]] || die "$1 needs a file"; hostfile="$2"; shift 2 ;;
    --ppn) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -ge 1 ]] || die "--ppn needs a whole number >= 1"; ppn="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --launcher) [[ $# -ge 2 && ( "$2" == mpirun || "$2" == torchrun ) ]] || die "--launcher takes mpirun or torchrun"; launcher="$2"; shift 2 ;;
    *) train_args+=("$1"); shift ;;
  esac
done

# ---------------------------------------------------------------- environment
# Use the active virtualenv (or conda env) if there is one; otherwise our own .venv.
if [[ -n "${VIRTUAL_ENV:-}" || -n "${CONDA_PREFIX:-}" ]]; then
  py="$(command -v python)"
else
  py="$here/.venv/bin/python"
fi
stamp_of() { cat "$here/pyproject.toml" "$here/constraints.txt" | cksum | cut -d' ' -f1; }
stamp_file="$(dirname "$py")/../.corecpu-installed"
if [[ ! -f "$stamp_file" || "$(cat "$stamp_file" 2>/dev/null)" != "$(stamp_of)" ]]; then
  if (( dry_run )); then
    echo "# would first set up $(dirname "$(dirname "$py")") and pip install -c constraints.txt -e '.[test]'"
  else
    if [[ ! -x "$py" ]]; then
      echo "launch.sh: creating $here/.venv" >&2
      python3 -m venv "$here/.venv" || die "python3 -m venv failed; install python3-venv or activate a virtualenv first"
    fi
    # An environment that already has torch keeps it (e.g. torch 2.8 for IPEX 2.8): corecpu accepts
    # any torch >= 2.8, and the 2.13.0 pin is only there so a fresh install avoids the CUDA build.
    pin=(-c "$here/constraints.txt")
    "$py" -c 'import torch' 2>/dev/null && pin=()
    echo "launch.sh: installing corecpu and its dependencies into $(dirname "$(dirname "$py")") (first run only)" >&2
    "$py" -m pip install -qq --disable-pip-version-check "${pin[@]}" -e "$here[test]" >&2 \
      || die "pip install failed (see above); fix the error and run launch.sh again"
    stamp_of > "$stamp_file"
  fi
fi
bindir="$(dirname "$py")"
export PATH="$bindir:$PATH"
if (( setup_only )); then echo "$py"; exit 0; fi

# ---------------------------------------------------------------- hosts and ranks
hosts=()
if [[ -n "$hostfile" ]]; then
  [[ -r "$hostfile" ]] || die "hostfile '$hostfile' not found; pass -f with a file listing one host per line"
  while read -r line; do
    line="${line%%#*}"; host="${line%%[: ]*}"
    [[ -n "$host" ]] && hosts+=("$host")
  done < "$hostfile"
  (( ${#hosts[@]} >= 1 )) || die "hostfile '$hostfile' lists no hosts; put one host name or address per line"
  [[ -n "$ppn" ]] || ppn=$(( (nranks + ${#hosts[@]} - 1) / ${#hosts[@]} ))
  (( ppn * ${#hosts[@]} >= nranks )) || die "$nranks ranks do not fit on ${#hosts[@]} hosts x --ppn $ppn; raise --ppn or add hosts"
  export MASTER_ADDR="${MASTER_ADDR:-${hosts[0]}}"
  local_ranks=$ppn
else
  [[ -z "$ppn" ]] || die "--ppn only makes sense with -f HOSTFILE"
  export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
  local_ranks=$nranks
fi
if [[ -z "${MASTER_PORT:-}" ]]; then
  # One host: any free port; several hosts: the conventional one (we cannot probe the others).
  if [[ -z "$hostfile" ]]; then
    MASTER_PORT="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 29500)"
  else
    MASTER_PORT=29500
  fi
fi
export MASTER_PORT

cores=$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || nproc)
oversub=()
if (( local_ranks > cores )); then
  warn "$local_ranks ranks on a host with $cores usable CPUs: ranks will share cores, 1 thread each (slow; fine for testing)"
  oversub=(--oversubscribe)
fi

if [[ -z "$launcher" ]]; then
  if command -v mpirun >/dev/null 2>&1; then launcher=mpirun
  elif command -v torchrun >/dev/null 2>&1; then launcher=torchrun
  else die "neither mpirun nor torchrun found; pip install impi-rt (or activate the env that has torch)"; fi
fi
[[ "$launcher" == torchrun && -n "$hostfile" ]] && die "-f HOSTFILE needs mpirun; pip install impi-rt, or run torchrun on each host yourself"

# Ranks write through mpirun's pipes; tell rank 0 when a person is watching, for the progress bar.
[[ -t 1 ]] && export CORECPU_TTY=1
bind=("$py" -m corecpu.bind "${oversub[@]}" --)
train=("$py" -u "$here/train.py" "${train_args[@]}")
if [[ "$launcher" == mpirun ]]; then
  # corecpu.bind pins each rank from its own node's plan, so Intel MPI's own pinning stays off.
  export I_MPI_PIN=0
  cmd=(mpirun -n "$nranks")
  [[ -n "$hostfile" ]] && cmd+=(-f "$hostfile" -ppn "$ppn")
  # Intel MPI propagates the whole environment (MASTER_*, PATH, ...) to every host by default.
  cmd+=("${bind[@]}" "${train[@]}")
else
  export OMP_NUM_THREADS=1  # corecpu.bind replaces it per rank; this silences torchrun's notice
  cmd=("$bindir/torchrun" --standalone --nproc-per-node "$nranks" --no-python "${bind[@]}" "${train[@]}")
fi

if (( dry_run )); then
  echo "# environment"
  for v in MASTER_ADDR MASTER_PORT I_MPI_PIN GLOO_SOCKET_IFNAME OMP_NUM_THREADS; do
    [[ -n "${!v:-}" ]] && echo "export $v=${!v}"
  done
  echo "# command"
  printf '%q ' "${cmd[@]}"; echo
  if "$py" -c 'import corecpu.plan' 2>/dev/null; then
    echo "# this host's plan for $local_ranks local rank(s)"
    "$py" -m corecpu.cli plan --nproc "$local_ranks" "${oversub[@]}" --export || true
  fi
  exit 0
fi

# ---------------------------------------------------------------- run, forwarding signals
# Not exec: launch.sh stays the process a scheduler or a person signals. It forwards SIGTERM
# (scancel, pod eviction), SIGINT (Ctrl-C) and SIGUSR1 (sbatch --signal=USR1@60) once to the
# launcher, which passes them to every rank; the ranks stop at the next step, save and exit 75.
# SIGHUP (the terminal went away) is forwarded as SIGTERM. The exit code is the launcher's.
# The launcher runs in its own process group (set -m) so a terminal's Ctrl-C reaches it only
# through us: mpiexec.hydra aborts without saving on a second Ctrl-C.
# Ranks export our PID and exit if we are killed outright (corecpu/lifeline.py).
export CORECPU_LAUNCHER_PID=$$
set -m
"${cmd[@]}" </dev/null &
child=$!
set +m
forwarded=0
forward() {
  local sig="$1" target="$child"
  forwarded=1
  if [[ "$launcher" == mpirun ]]; then
    # mpirun is a shell script around mpiexec.hydra, which is the one that forwards to the ranks.
    target="$(pgrep -P "$child" -x mpiexec.hydra 2>/dev/null | head -n1)"
    [[ -n "$target" ]] || target="$child"
  elif [[ "$sig" == USR1 ]]; then
    sig=TERM  # torchrun's agent does not forward SIGUSR1; it forwards SIGTERM to every worker
  fi
  kill -s "$sig" "$target" 2>/dev/null || true
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward USR1' USR1
trap 'forward TERM' HUP
while :; do
  forwarded=0 rc=0
  wait "$child" || rc=$?
  (( forwarded )) || break  # wait returns early when a trapped signal arrives; the child still runs
done
exit "$rc"
