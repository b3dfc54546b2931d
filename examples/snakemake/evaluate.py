"""The workflow's evaluation step (a plugin job): the trained model's loss on held-out data of the same problem.

Held-out batches come from examples/train.py's own generator with a rank no training process had, so the number is
comparable to the training loss the launcher's log ends with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import train  # noqa: E402  (examples/train.py: the model's shape and the synthetic problem)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    with open(args.spec) as fh:
        spec = json.load(fh)
    ckpt = torch.load(args.model, map_location="cpu", weights_only=True)
    model = nn.Sequential(nn.Linear(train.FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    model.load_state_dict({k.removeprefix("module."): v for k, v in ckpt["model"].items()})
    with torch.no_grad():
        x, y = train.batch(spec["seed"], spec["heldout_rank"], 0, 512, "cpu")
        mse = nn.functional.mse_loss(model(x), y).item()
        base = nn.functional.mse_loss(torch.zeros_like(y), y).item()
    result = {"step": int(ckpt["step"]), "heldout_mse": mse, "predict_zero_mse": base,
              "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "host": os.environ.get("SLURMD_NODENAME")}
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, args.out)
    print(f"evaluate: {result}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
