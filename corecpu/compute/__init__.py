"""How a rank computes: fp32 or bf16 (AMX, or a cached calibration of the model's shapes), sdpa or eager
attention (timed on the model, cached) and eager attention's masks (bf16 under autocast; packed bool masks as
numbers), the dropout kernel, a frozen base cast to bf16 once, a classifier's last layer at its first token only,
the word embedding's gradient on kept memory, and Intel Extension for PyTorch where it is installed.

May import: corecpu.errors, corecpu.envvars, corecpu.cpu; torch.
"""

# The choices this subpackage offers, defined once: setup(), the CLI and the decisions read them here.
PRECISIONS = ("auto", "fp32", "bf16")
IPEX_CHOICES = ("auto", "off")
ATTENTION_CHOICES = ("auto", "sdpa", "eager")
DROPOUT_CHOICES = ("fast", "torch")
LAST_LAYER_CHOICES = ("auto", "full")
