"""Data, bottom to top: types (labelled examples), tokenized (tokenized sets, collation), columns
(which column is what), files (TSV/CSV/JSONL), hf (Hugging Face datasets), builtin (generated
classification tasks), sources (what --data names), sampling (DDP samplers and loaders),
tokencache (tokenize once per host); for question answering, qa (SQuAD JSON and flat QA data)
and builtin_qa (a generated QA set); for causal-LM fine-tuning, builtin_sft (a generated instruction set),
causal_records (text, prompt/completion and chat data from files), causal_tokens (token ids and loss masks)
and packing (bins, features, collation).

May import: corecpu.errors, corecpu.envvars, corecpu.distributed; torch, transformers.
"""
