"""One rank of the per-host tokenization cache check (run by tests/multiprocess/test_tokenization_cache.py).

argv: OUT_JSON CACHE_DIR DATA_SPEC. Counts how often this rank's tokenizer is called.
"""

import hashlib
import json
import sys
from pathlib import Path

from corecpu.data.sources import load_data
import corecpu
from corecpu.training.modeling import load_tokenizer
from corecpu.data.tokencache import tokenize_cached

out, cache_dir, spec = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
tokenizer = load_tokenizer("tiny")
calls = []
original = type(tokenizer).__call__
type(tokenizer).__call__ = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)

with corecpu.setup(backend="gloo", dist_timeout=60) as ctx:
    data = load_data(spec, split="train")
    ds = tokenize_cached(data, tokenizer, 32, cache_dir, local_rank=ctx.launch.local_rank)
    digest = hashlib.sha256(json.dumps([ds.input_ids, ds.token_type_ids, ds.labels]).encode()).hexdigest()
    result = {"rank": ctx.rank, "tokenized": len(calls), "digest": digest, "n": len(ds),
              "cached_type": type(ds).__name__}
    Path(f"{out}.{ctx.rank}").write_text(json.dumps(result))
