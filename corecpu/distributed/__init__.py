"""The process group (rendezvous with a bounded start-up, backend choice, teardown, small
collectives) and the gradient all-reduce paths DDP can use.

May import: corecpu.errors, corecpu.envvars, corecpu.cluster, corecpu.cpu; torch.
"""

# The choices this subpackage offers, defined once: setup(), the CLI and the planners read them here.
BACKENDS = ("auto", "gloo", "ccl", "mpi")  # the process group
# DDP's gradient buckets (gloo, ccl: DDP's own, on that backend; mpi, shm: corecpu's hooks on one comm thread)
ALLREDUCE_CHOICES = ("auto", "gloo", "mpi", "ccl", "shm")
ALLREDUCE_DTYPES = ("fp32", "bf16")  # what gradient buckets travel as
SPARSE_EMBEDDING_CHOICES = ("auto", "on", "off")  # the word embedding's rows all-reduced by the rows touched
