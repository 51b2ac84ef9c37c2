"""The command line of `corecpu launch` and launch.sh, parsed with argparse, in torchrun's spellings.

    corecpu launch -n 2 my_loop.py --my-args                 # 2 ranks in all
    corecpu launch --nproc-per-node 2 my_loop.py             # the same, as torchrun says it
    corecpu launch -n 8 -f hosts --ppn 4 train.py            # 2 hosts x 4 ranks through Intel MPI
    corecpu launch --nnodes 2 --node-rank 0 --master-addr node-a --nproc-per-node 4 train.py   # torchrun, per node
    ./launch.sh 2 --log-dir=logs --tee 0:3 --model tiny      # launch.sh: N first, train.py's flags mixed in

One meaning per name, everywhere in corecpu: `-n`/`-np` (and launch.sh's N) is the total number of
ranks, as mpirun's `-n`; `--nproc-per-node` (torchrun), `--ppn` (mpirun) and `--nproc` (corecpu plan,
env, bind) are the ranks on each node. Options come before the script; everything after the script
is the script's (torchrun's rule). launch.sh has a default script, train.py, so what precedes a script
and is not the launcher's goes to train.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, Sequence

from corecpu.errors import CoreCPUError
from corecpu.launching.rank_logs import parse_ranks, parse_std_spec

# `corecpu launch -n 2 train ...`: the train.py shipped in the package (corecpu/train.py), run as a module so
# that the installed package, not a directory on sys.path, provides it.
TRAIN = "train"
TRAIN_MODULE = "corecpu.train"


@dataclass
class LaunchRequest:
    nranks: int | None  # ranks in all; None: nnodes x ppn (resolved by plan_launch, which reads a hostfile)
    script: str
    script_args: list[str] = field(default_factory=list)
    hostfile: str | None = None
    ppn: int | None = None  # ranks per node
    dry_run: bool = False
    launcher: str | None = None
    log_dir: str | None = None
    module: str | None = None  # run `python -m module` instead of the script's path (corecpu's train)
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    redirects: str | None = None  # torchrun's -r/--redirects spec ("3", "0:3,1:2"), normalized
    tee: str | None = None  # torchrun's -t/--tee spec
    local_ranks_filter: str | None = None  # torchrun's --local-ranks-filter ("0,1")
    oversubscribe: bool = False
    auto: bool = False  # `./launch.sh auto` / `-n auto`: the ranks per node chosen by measurement (auto_ranks)
    global_batch: int | None = None  # --global-batch-size: train.py's per-rank batch follows the rank count


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, corecpu's way, instead of usage + exit 2
        raise CoreCPUError(f"{message}; see corecpu launch --help")


def _count(flag: str):
    def parse(text: str) -> int:
        if not text.strip().lstrip("-").isdigit():
            if ":" in text:
                raise CoreCPUError(f"{flag} {text!r}: elastic MIN:MAX is not supported; give one number")
            raise CoreCPUError(f"{flag} needs a whole number, got {text!r}; e.g. {flag} 2")
        if int(text) < (0 if flag == "--node-rank" else 1):
            raise CoreCPUError(f"{flag} must be at least {0 if flag == '--node-rank' else 1}, got {text}")
        return int(text)
    return parse


def _count_or_auto(text: str) -> int | str:
    return "auto" if text == "auto" else _count("-n")(text)


def build_parser(with_help: bool = True) -> argparse.ArgumentParser:
    """with_help=False for launch.sh, whose --help after N is train.py's (./launch.sh -h is its own usage)."""
    p = _Parser(prog="corecpu launch", allow_abbrev=False, add_help=False,
                usage="corecpu launch [options] SCRIPT.py|train [ARGS...]   (launch.sh: ./launch.sh N [options] [SCRIPT.py] [ARGS...])",
                description="Start ranks of a training script, each bound to its own cores by corecpu.bind. "
                "Everything after SCRIPT.py is the script's; `train` is corecpu's own train.py.",
                epilog="--log-dir alone is --redirects 3 --tee 0:3: every rank's output in its file, local rank 0's "
                "on the console too. A rank whose output goes to a file draws no progress bar (no escape codes in "
                "the file).")
    if with_help:
        p.add_argument("-h", "--help", action="help", help="show this help and exit")
    p.add_argument("-n", "-np", dest="nranks", type=_count_or_auto, metavar="N",
                   help="ranks in all (mpirun's -n; launch.sh's N); auto: the ranks per node that trained train.py's "
                   "job fastest on this node, measured (once per job and machine) with the global batch held")
    p.add_argument("--global-batch-size", "--global_batch_size", dest="global_batch", type=_count("--global-batch-size"),
                   metavar="G", help="train.py: examples per optimizer step; each rank gets --batch-size G / (ranks x "
                   "--grad-accum). Default with auto: twice the task's per-rank default")
    p.add_argument("--nproc-per-node", "--nproc_per_node", "--ppn", "--nproc", dest="ppn", type=_count("--nproc-per-node"),
                   metavar="P", help="ranks on each node (torchrun's --nproc-per-node; mpirun's --ppn; as in corecpu "
                   "plan --nproc). Default: N divided evenly over the nodes")
    p.add_argument("--nnodes", type=_count("--nnodes"), metavar="M",
                   help="nodes: with -f, the first M hosts of HOSTFILE (default: all); without -f, torchrun run once "
                   "per node with --node-rank and --master-addr (static rendezvous)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=_count("--node-rank"), metavar="R",
                   help="this node's rank, 0 to M-1, when each node runs its own launcher (torchrun's)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", metavar="HOST",
                   help="rank 0's host (default: $MASTER_ADDR, else HOSTFILE's first host, else 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=_count("--master-port"), metavar="PORT",
                   help="rank 0's port (default: $MASTER_PORT, else a free port on one host, else 29500)")
    p.add_argument("-f", "--hostfile", metavar="HOSTFILE", help="hosts, one per line, rank 0's first: mpirun over them")
    p.add_argument("--launcher", choices=("mpirun", "torchrun"), help="default: mpirun if found, else torchrun")
    p.add_argument("--dry-run", action="store_true", help="print the command, its environment and this host's plan")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than a node's cores: ranks share them, 1 thread each (slow; for testing)")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", metavar="DIR",
                   help="ranks' output files DIR/rank-N.log (N: the global rank); a failed job prints their last lines")
    p.add_argument("-r", "--redirects", type=_std("--redirects"), metavar="SPEC",
                   help="torchrun's: streams to the file only, 0 none 1 stdout 2 stderr 3 both, for every local rank "
                   "or per local rank (0:3,1:2)")
    p.add_argument("-t", "--tee", type=_std("--tee"), metavar="SPEC",
                   help="torchrun's: streams to the file and the console (same SPEC)")
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter", type=_filter,
                   metavar="LIST", help="torchrun's: only these local ranks' output on the console (e.g. 0)")
    p.add_argument("--standalone", action="store_true", help="torchrun's: one node (the default without -f)")
    return p


def _std(flag: str):
    def parse(text: str) -> str:
        parse_std_spec(text, flag)  # raises a one-line error
        return text.replace(" ", "")
    return parse


def _filter(text: str) -> str:
    parse_ranks(text, "--local-ranks-filter")
    return text.replace(" ", "")


_PARSER, _PARSER_NO_HELP = build_parser(), build_parser(with_help=False)
# The launcher's own words as argv may spell them (`-n 2`, `-n2`, `--log-dir=x`); a valued option's value is
# never the script.
_VALUED = {s for a in _PARSER._actions if a.option_strings and a.nargs is None and a.dest != "help"
           and not isinstance(a, argparse._StoreTrueAction) for s in a.option_strings}
_FLAGS = {s for a in _PARSER._actions if isinstance(a, (argparse._StoreTrueAction, argparse._HelpAction))
          for s in a.option_strings}


def _width(word: str) -> int:
    """How many words of argv the launcher option `word` takes (0: not the launcher's)."""
    if word in _FLAGS:
        return 1
    if word in _VALUED:
        return 2
    if word.startswith("--"):
        return 1 if word.split("=", 1)[0] in _VALUED and "=" in word else 0
    return 1 if len(word) > 2 and word[:2] in _VALUED else 0  # -n2, -t3


def split_script(argv: Sequence[str], default_script: bool) -> int | None:
    """Index of the script in argv, or None. corecpu launch: the first word that is no option and no option's
    value. launch.sh (a default script): a SCRIPT.py among the launcher's own options; the first word that is
    not the launcher's starts train.py's arguments."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":  # torchrun-style separator: the script follows
            return i + 1 if i + 1 < len(argv) else None
        width = _width(word)
        if width:
            i += width
        elif not word.startswith("-") and (word.endswith(".py") or not default_script):
            return i
        elif default_script:
            return None
        else:
            i += 1
    return None


def parse_args(argv: Sequence[str], default_script: str | None = None) -> LaunchRequest:
    """`corecpu launch [options] SCRIPT [ARGS]`; with `default_script` (launch.sh), a bare N may come first and
    words that are not the launcher's go to the default script (train.py) when no SCRIPT.py is named."""
    argv = list(argv)
    nranks_first: int | str | None = None
    if default_script is not None and argv and not argv[0].startswith("-"):
        if not argv[0].endswith(".py"):
            nranks_first = _ranks(argv.pop(0))
    at = split_script(argv, default_script=default_script is not None)
    options, script_words = (argv, []) if at is None else (argv[:at], argv[at:])
    if options and options[-1] == "--":
        options = options[:-1]
    if default_script is not None:
        ns, rest = _PARSER_NO_HELP.parse_known_args(options)
    else:
        ns, rest = _PARSER.parse_args(options), []
    if nranks_first is not None:
        if ns.nranks is not None and ns.nranks != nranks_first:
            raise CoreCPUError(f"N is {nranks_first} but -n says {ns.nranks}; give the number of ranks once")
        ns.nranks = nranks_first
    auto = ns.nranks == "auto"
    req = LaunchRequest(None if auto else ns.nranks, "", hostfile=ns.hostfile, ppn=ns.ppn, dry_run=ns.dry_run, launcher=ns.launcher,
                        log_dir=ns.log_dir, nnodes=ns.nnodes, node_rank=ns.node_rank, master_addr=ns.master_addr,
                        master_port=ns.master_port, redirects=ns.redirects, tee=ns.tee,
                        local_ranks_filter=ns.local_ranks_filter, oversubscribe=ns.oversubscribe, auto=auto,
                        global_batch=ns.global_batch)
    if script_words:
        req.script, req.script_args = script_words[0], script_words[1:]
        if req.script == TRAIN:
            req.script, req.module = str(Path(__file__).resolve().parents[1] / "train.py"), TRAIN_MODULE
        if rest:
            raise CoreCPUError(f"unknown option {rest[0]!r} before {script_words[0]}; the script's arguments go after it")
    elif default_script is not None:
        if ns.nranks is None and ns.ppn is None and rest and (rest[0] == "auto" or rest[0].isdigit()):
            # `./launch.sh --launcher torchrun 2`: a bare word after the launcher's options would go to train.py
            raise CoreCPUError(f"the number of ranks goes first, before the launcher's options: ./launch.sh {rest[0]} "
                               f"[options] [train.py's flags] (got {rest[0]!r} after an option)")
        req.script, req.script_args = default_script, rest
    else:
        raise CoreCPUError("no training script; put SCRIPT.py after the options, e.g. corecpu launch -n 2 train.py")
    check(req, ns.standalone)
    return req


def check(req: LaunchRequest, standalone: bool = False) -> None:
    """What the options say together, before anything is planned."""
    if req.auto and req.ppn is not None:
        raise CoreCPUError("auto chooses the ranks per node; drop --nproc-per-node, or give a number instead of auto")
    if (req.auto or req.global_batch) and not (Path(req.script).name == "train.py" or req.module):
        raise CoreCPUError(f"{'auto' if req.auto else '--global-batch-size'} sets train.py's --batch-size; with "
                           "your own script give the number of ranks and your script's own batch flag")
    if req.nranks is None and req.ppn is None and not req.auto:
        raise CoreCPUError("how many ranks? e.g. ./launch.sh 2, corecpu launch -n 2 SCRIPT.py, or "
                           "--nproc-per-node 2 (ranks per node)")
    if not Path(req.script).is_file():
        raise CoreCPUError(f"script {req.script!r} not found; pass the path of a .py file")
    nodes = req.nnodes or 1
    if standalone and (req.hostfile or nodes > 1):
        raise CoreCPUError("--standalone is one node; drop it, or drop -f/--nnodes")
    if req.hostfile is None and nodes == 1 and req.nranks is not None and req.ppn is not None and req.nranks != req.ppn:
        raise CoreCPUError(f"-n {req.nranks} ranks in all but --nproc-per-node {req.ppn} on the only node; give one "
                           "of them (or -f HOSTFILE / --nnodes for several nodes)")
    if req.hostfile is None and nodes > 1:
        if req.node_rank is None or not req.master_addr:
            raise CoreCPUError(f"--nnodes {nodes} without -f HOSTFILE runs one launcher per node: give each "
                               "--node-rank R and --master-addr (rank 0's host), or use -f HOSTFILE with mpirun")
        if req.launcher == "mpirun":
            raise CoreCPUError("mpirun starts every node from one launcher: use -f HOSTFILE instead of "
                               "--nnodes/--node-rank, or --launcher torchrun")
        if req.nranks is not None and (req.ppn is None and req.nranks % nodes or
                                       req.ppn is not None and req.nranks != req.ppn * nodes):
            raise CoreCPUError(f"-n {req.nranks} does not split into {nodes} nodes; give --nproc-per-node instead")
    if req.node_rank is not None and not 0 <= req.node_rank < nodes:
        raise CoreCPUError(f"--node-rank {req.node_rank} is not a node of --nnodes {nodes} (0 to {nodes - 1})")
    if req.node_rank is not None and req.hostfile:
        raise CoreCPUError("--node-rank is for one launcher per node; with -f HOSTFILE mpirun starts every host")
    if (req.redirects or req.tee) and not req.log_dir:
        raise CoreCPUError("--redirects and --tee write to files in --log-dir; add --log-dir DIR")


def _ranks(text: str) -> int | str:
    if text == "auto":
        return text
    if not text.lstrip("-").isdigit():
        raise CoreCPUError(f"N must be a whole number of ranks or auto, got {text!r}; e.g. ./launch.sh 2")
    if int(text) < 1:
        raise CoreCPUError(f"N must be at least 1, got {text}; e.g. ./launch.sh 2")
    return int(text)
