"""The workflow's pre-processing step (a plugin job): writes the training spec that train and evaluate read.

It stands in for real pre-processing (tokenising, sharding): what matters for the example is that it runs as its
own small Slurm job and that its output decides the training (``--read KEY`` prints one value for the train rule).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out")
    p.add_argument("--read", nargs=2, metavar=("KEY", "SPEC"), help="print KEY of an existing spec and exit")
    args = p.parse_args(argv)
    if args.read:
        key, path = args.read
        with open(path) as fh:
            print(json.load(fh)[key])
        return 0
    spec = {"seed": args.seed, "steps": args.steps, "heldout_rank": 10_000,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "host": os.environ.get("SLURMD_NODENAME",
                                                                                   socket.gethostname())}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(spec, fh, indent=1)
    os.replace(tmp, args.out)
    print(f"prepare: {spec}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
