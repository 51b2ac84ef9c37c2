"""This machine's CPUs and how ranks fit on them: /sys topology, the cgroup cpuset and quota,
ISA flags and installed extensions (by metadata), the pure per-node plan, this rank's share of
it, the threads a rank runs, and what else takes a rank's CPUs while it trains (contention).

May import: corecpu.errors, corecpu.envvars, corecpu.cluster. Torch-free: corecpu.bind applies
the plan before torch loads (threads.configure_threads imports torch only when it runs).
"""
