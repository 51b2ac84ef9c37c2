#!/usr/bin/env bash
# Run the whole test suite (all three tiers). Sets up .venv on first use, like launch.sh.
#   ./test.sh                 # everything
#   ./test.sh -m "not e2e"    # pure and multi-process tiers only; any pytest arguments work
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="$("$here/launch.sh" --setup-only test)"
cd "$here"
export PATH="$(dirname "$py"):$PATH"  # mpirun (impi-rt) and torchrun live beside the venv's python
exec "$py" -m pytest "$@"
