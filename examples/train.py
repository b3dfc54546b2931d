"""A small real DDP training: a tiny regression model on synthetic data it makes itself.

Run it under torchrun (one agent per node, one process per GPU) or alone as a single process:

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=HEAD:29500 train.py
    python train.py --steps 20

Why it looks like this: it is the job that proves a launcher works end to end, so it exercises what a real training
needs from the launcher and the cluster and nothing else: a process group (gloo on CPU, NCCL on GPU) whose world size
must come out right, an all-reduce every step (DDP gradients), a checkpoint it resumes from (a requeued job continues),
and SIGUSR2 handling (Slurm's ``--signal=USR2@90`` before the time limit: checkpoint, then exit 0).

Every rank prints ``rank R/W step S loss L``; rank 0 ends with one ``result:`` line that the demo and tests read.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 16


def say(line: str) -> None:
    """One line in one write: ranks of a node share one output file, and print() writes the text and its newline
    in two calls when the stream is unbuffered (torchrun's workers), so another rank's line could land between them
    (seen on the sandbox: a `result:` line with a `rank 1/4 step ...` glued to its end)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="train until this global step (default 60)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--checkpoint", default="checkpoints/train.pt", help="checkpoint file (resumed from if present)")
    p.add_argument("--checkpoint-every", type=int, default=20, help="save every N steps (and at the end)")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this long per step (to test signals)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic problem")
    return p.parse_args(argv)


def init_distributed() -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes (env://), or form a group of one when run alone."""
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    if "RANK" not in os.environ:  # run directly: a world of one on a free local port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=5))
    return dist.get_rank(), dist.get_world_size(), device


def batch(seed: int, rank: int, step: int, size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data: y = x @ w_true + noise; w_true depends only on ``seed``, x on (seed, rank, step)."""
    w_true = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(size, FEATURES, generator=g)
    y = x @ w_true + 0.01 * torch.randn(size, 1, generator=g)
    return x.to(device), y.to(device)


def save_checkpoint(path: str, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    """Rank 0 writes to a temp file and renames it: a job killed mid-write never leaves a broken checkpoint."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict()}, tmp)
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    stop = {"signal": False}
    signal.signal(signal.SIGUSR2, lambda *_: stop.update(signal=True))
    rank, world, device = init_distributed()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    optim = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    if os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optim.load_state_dict(ckpt["optim"])
        start = int(ckpt["step"])
        if rank == 0:
            say(f"rank {rank}/{world} resumed from {args.checkpoint} at step {start}")
    ddp = nn.parallel.DistributedDataParallel(model)
    first = last = None
    step = start
    while step < args.steps:
        flag = torch.tensor([1.0 if stop["signal"] else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if flag.item() > 0:
            if rank == 0:
                save_checkpoint(args.checkpoint, step, model, optim)
                say(f"rank {rank}/{world} SIGUSR2: checkpoint at step {step} in {args.checkpoint}; exiting")
            dist.barrier()
            break
        x, y = batch(args.seed, rank, step, args.batch, device)
        loss = nn.functional.mse_loss(ddp(x), y)
        optim.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optim.step()
        step += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        first = mean if first is None else first
        last = mean
        say(f"rank {rank}/{world} step {step} loss {loss.item():.4f}")
        if rank == 0 and (step % args.checkpoint_every == 0 or step == args.steps):
            save_checkpoint(args.checkpoint, step, model, optim)
        if args.step_delay:
            time.sleep(args.step_delay)
    if rank == 0:
        fmt = lambda v: "none" if v is None else f"{v:.4f}"  # noqa: E731
        say(f"result: world_size={world} start_step={start} end_step={step} first_loss={fmt(first)} "
            f"last_loss={fmt(last)} checkpoint={args.checkpoint}")
    dist.barrier()  # leave together: no rank exits while a peer still saves or reduces
    return 0


if __name__ == "__main__":
    rc = main()
    # Everything is saved and every rank is past the last barrier: leave at once, without torch's teardown (no
    # destroy_process_group, no interpreter exit); the kernel closes the sockets, the driver the GPU contexts. Both
    # kinds of teardown failed finished jobs here, CPU and gloo on 2 busy cores (docs/launcher-rules.md, rule 12):
    # - torch 2.0.1: destroy_process_group hung in ~ProcessGroupGloo, which joins gloo's worker thread while it
    #   holds the GIL, and that thread needed the GIL to free the last step's tensors (a deadlock, pytorch#56297;
    #   1 run of 17 with two agents on 2 busy cores; twice in CI). The rendezvous host's torchrun gave up its 300 s
    #   exit barrier and ended, and the torchrun still watching the hung rank lost the c10d store and failed the job.
    # - torch 2.13: std::terminate in a static destructor at interpreter exit (SIGABRT), about 1 run in 10.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
