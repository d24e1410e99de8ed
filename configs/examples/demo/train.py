"""A tiny training script that uses nothing of trainmaster: it reads the job environment and writes outputs.

It saves its model with the `safetensors` package, as a user's script would: install it where the job runs
(`pip install safetensors`; trainmaster's `dev` extra has it).
"""

import argparse
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

out = Path(os.environ.get("TRAINMASTER_OUTPUT_DIR", "outputs"))
out.mkdir(parents=True, exist_ok=True)
seed = int(os.environ.get("TRAINMASTER_SEED", "0"))
torch.manual_seed(seed)

teacher = torch.nn.Linear(8, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
with open(out / "metrics.jsonl", "w") as metrics:
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 8)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            metrics.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            print(f"step {step} loss {loss.item():.4f}", flush=True)

save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
(out / "result.json").write_text(json.dumps({"final_loss": loss.item(), "steps": args.steps}))
print("done", flush=True)
