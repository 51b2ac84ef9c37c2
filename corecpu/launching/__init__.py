"""Starting ranks: `corecpu launch` / launch.sh (launch), the per-rank exec wrapper that binds
before torch loads (bind), and the install-time CUDA-build notice (install).

May import: corecpu.errors, corecpu.envvars, corecpu.cluster, corecpu.cpu, corecpu.reliability.lifeline.
Also `corecpu env` (environment): versions, CPU, launcher, cgroup limits and plan for a bug report.
Torch-free.
"""
