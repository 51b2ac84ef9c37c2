"""The front door and what a loop needs around it: setup() and Run, the step loop, the schedule,
checkpoints (files and the checkpointer), the output directory, models (modeling; builtin_models: the built-in
causal LMs) and the configuration.

May import every subpackage below it: cluster, cpu, distributed, compute, reliability, data.
"""
