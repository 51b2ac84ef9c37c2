"""Data, bottom to top: types (examples, tokenized sets, collation), columns (which column is
what), files (TSV/CSV/JSONL), hf (Hugging Face datasets), builtin (generated tasks), sources
(what --data names), sampling (DDP samplers and loaders), tokencache (tokenize once per host).

May import: corecpu.errors, corecpu.envvars, corecpu.distributed; torch, transformers.
"""
