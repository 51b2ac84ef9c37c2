#!/usr/bin/env bash
# Run the whole test suite (all tiers). Sets up .venv on first use, like launch.sh.
#   ./test.sh                 # everything, on two pytest workers (CORECPU_TEST_WORKERS=N; 0: one process)
#   ./test.sh -m "not e2e"    # pure and multi-process tiers only; any pytest arguments work (one process)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$("$here/launch.sh" --setup-only test)"
cd "$here"
export PATH="$(dirname "$py"):$PATH"  # mpirun (impi-rt) and torchrun live beside the venv's python
# The whole suite on two workers: a quarter of its wall time is CPU left idle (a job waiting out a step timeout
# or a heartbeat, a rank blocked in a rendezvous, checkpoints being fsynced), which the other worker's tests
# fill. A file's tests stay on one worker (--dist loadfile): module fixtures are built once, and a file's
# tests never race each other. Each worker has its own corecpu cache (tests/conftest.py).
workers="${CORECPU_TEST_WORKERS:-2}"
if [[ $# -eq 0 && "$workers" != 0 ]]; then
  set -- -n "$workers" --dist loadfile
fi
exec "$py" -m pytest "$@"
