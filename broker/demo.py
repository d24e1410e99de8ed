"""`./dev demo`: train the DQN recipe on CartPole on the embedded default (local backend, SQLite).

It submits the shipped example job, streams its log, and prints where the outputs are, the final
checkpoint, its commitment and the final return. `./dev demo --steps N` shortens or lengthens it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from rich.console import Console

from trainmaster.broker import paths
from trainmaster.broker.cli import render
from trainmaster.broker.service import Broker


def example_job(steps: int | None) -> Path:
    """The shipped example, copied so that `--steps` can change its entrypoint."""
    source = resources.files("trainmaster.configs") / "examples" / "dqn" / "job.yaml"
    text = source.read_text()
    if steps is not None:
        text = text.replace("--steps 10000", f"--steps {steps}")
    folder = Path(tempfile.mkdtemp(prefix="trainmaster-demo-"))
    (folder / "job.yaml").write_text(text)
    return folder / "job.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev demo", description=__doc__)
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the example's 10,000)")
    args = parser.parse_args(argv)
    console = Console()
    spec = example_job(args.steps)
    try:
        return asyncio.run(run(console, spec))
    finally:
        shutil.rmtree(spec.parent, ignore_errors=True)


async def run(console: Console, spec: Path) -> int:
    broker = Broker()
    try:
        job = await broker.submit(spec)
        console.print(f"submitted [bold]{job.id}[/bold] (DQN on CartPole-v1, local backend); its log:", highlight=False)
        async for text in broker.logs(job.id, follow=True):
            sys.stdout.write(text)
        job = await broker.wait(job.id)
        render.print_job(console, broker, job)
        if job.state == "accepted":
            summarize(console, paths.job_dir(job.id) / "outputs")
        console.print(f"state: {paths.state_db()}", highlight=False)
        return 0 if job.state == "accepted" else 1
    finally:
        broker.close()


def summarize(console: Console, outputs: Path) -> None:
    result = json.loads((outputs / "result.json").read_text())
    commitment = (outputs / "commitment.json").read_text()
    console.print(f"final checkpoint: {outputs / 'model.safetensors'} (segment {result['n']} of the run, "
                  f"sha256 {result['final_sha256']})", highlight=False, soft_wrap=True)
    console.print(f"commitment: {commitment}", highlight=False, soft_wrap=True)
    console.print(f"final return (mean of the last 20 episodes): [bold]{result['mean_return_last_20']:.1f}[/bold] "
                  f"over {result['episodes']} episodes", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
