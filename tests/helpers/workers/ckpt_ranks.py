"""One rank of the collective checkpoint checks (run by tests/multiprocess/test_checkpoint_ranks.py)."""

import json
import shutil
import sys
from collections import namedtuple
from pathlib import Path

import torch

from corecpu.training import checkpoint_state as ckpt
import corecpu
from corecpu.errors import CoreCPUError

out_dir, result_dir = Path(sys.argv[1]), Path(sys.argv[2])
result = {}
with corecpu.setup(backend="gloo", dist_timeout=30) as ctx:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + ctx.rank)  # each rank's own stream, as dropout has
    ckpt.save(out_dir, step=1, model=model, optimizer=opt)
    result["expected_draw"] = torch.rand(2).tolist()
    ckpt.save(out_dir, step=2, model=model, optimizer=opt)
    # Rank 0 alone finds the disk full: every rank must raise the same one line, none may hang.
    if ctx.rank == 0:
        real = shutil.disk_usage
        shutil.disk_usage = lambda p: namedtuple("U", "total used free")(1, 1, 1000)
    try:
        ckpt.save(out_dir, step=3, model=model, optimizer=opt)
    except CoreCPUError as exc:
        result["disk_full"] = str(exc)
    if ctx.rank == 0:
        shutil.disk_usage = real
        state = out_dir / "checkpoints" / "step-00000002" / "state.pt"
        state.write_bytes(state.read_bytes()[:100])
    torch.distributed.barrier()  # the truncation happens before anyone resumes
    torch.manual_seed(999)
    loop = ckpt.resume(out_dir, "auto", model=model, optimizer=opt)
    result.update(step=loop.step, notes=loop.notes, draw=torch.rand(2).tolist())
(result_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
