"""One rank of the sharded-checkpoint checks (run by tests/multiprocess/test_checkpoint_shards.py)."""

import errno
import json
import socket
import sys
from pathlib import Path

import torch

import corecpu
from corecpu.errors import CoreCPUError
from corecpu.training import checkpoint_shards, checkpoint_state as ckpt

out_dir, result_dir = Path(sys.argv[1]), Path(sys.argv[2])
checkpoint_shards.SHARD_MIN_BYTES = 0  # shard even this small state


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # the same replica on every rank, as DDP keeps it
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def failing(exc: BaseException):  # noqa: ANN201
    def write_file(path: Path, obj: object) -> dict:
        path.write_bytes(b"half")
        raise exc
    return write_file


result: dict = {}
with corecpu.setup(backend="gloo", dist_timeout=60) as ctx:
    model, opt = trained()
    path = ckpt.save(out_dir, step=1, model=model, optimizer=opt)
    if ctx.rank == 0:
        result["files"] = sorted(p.name for p in path.iterdir())
        result["meta_files"] = sorted(json.loads((path / "meta.json").read_text())["files"])
        result["export_optimizer_equal"] = same(ckpt.read_checkpoint(path)[1]["optimizer"], opt.state_dict())

    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 2))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    ckpt.resume(out_dir, "auto", model=fresh, optimizer=fresh_opt)
    result["model_equal"] = same(fresh.state_dict(), model.state_dict())
    result["optimizer_equal"] = same(fresh_opt.state_dict(), opt.state_dict())

    real_write = ckpt.write_file
    for name, exc in (("disk_full", OSError(errno.ENOSPC, "No space left on device")),
                      ("unexpected", RuntimeError("boom on rank 1"))):
        if ctx.rank == 1:
            ckpt.write_file = failing(exc)  # rank 1 alone fails to write its part
        try:
            ckpt.save(out_dir, step=2, model=model, optimizer=opt)
            result[name] = "saved"
        except CoreCPUError as e:
            result[name] = f"CoreCPUError: {e}"
        except RuntimeError as e:
            result[name] = f"RuntimeError: {e}"
        ckpt.write_file = real_write
        torch.distributed.barrier()
        if ctx.rank == 0:
            result[f"{name}_left"] = sorted(p.name for p in (out_dir / "checkpoints").iterdir())

    # A rank 1 on another host does not see rank 0's output directory for certain: rank 0 writes it all.
    if ctx.rank == 1:
        socket.gethostname = lambda: "another-host"
    path = ckpt.save(out_dir / "two-hosts", step=1, model=model, optimizer=opt)
    if ctx.rank == 0:
        result["two_hosts_files"] = sorted(p.name for p in path.iterdir())
(result_dir / f"rank{ctx.rank}.json").write_text(json.dumps(result))
