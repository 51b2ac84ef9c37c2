"""corecpu: data-parallel transformer training on CPU clusters.

train.py (beside this package) is the script; these modules are the library it
imports: launcher detection, process-group set-up, CPU topology and pinning,
data, checkpoints and metrics.
"""

__version__ = "0.1.0"
