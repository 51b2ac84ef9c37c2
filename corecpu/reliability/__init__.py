"""Nothing lost, nothing left behind: stop signals that save the run (preempt), a watchdog that
names a hung rank (watchdog), ranks that die with their launcher (lifeline, torch-free).

May import: corecpu.errors, corecpu.envvars, corecpu.cluster, corecpu.distributed.
"""
