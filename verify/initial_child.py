"""Build a job's S_0 in this process and print its digests: the child :mod:`trainmaster.verify.initial_state` starts
with ``ATEN_CPU_CAPABILITY`` set to the CPU kernel set an executor's commitment names (torch reads it once, at start-up).

    python -m trainmaster.verify.initial_child ANSWER.json < request.json

The request (JSON on stdin, written by the verifier, never by an executor)::

    {"recipe": "tiny-lm" | "package.module:attr", "config": {...}, "seed": 7, "device": "cpu"}

``recipe`` is a shipped recipe's name, or a job's own recipe (``module:attr``, importable from the working directory
and PYTHONPATH the parent gives: the verified bundle). The answer (JSON, written to ANSWER.json: whatever a recipe prints goes elsewhere)::

    {"kernels": "DEFAULT", "weights_sha256": "…", "rest_sha256": "…"}

``kernels`` is the kernel set torch selected here (``torch.backends.cpu.get_cpu_capability()``): a machine whose CPU
cannot run the one asked for selects another, which the parent sees. The digests are those of S_0 as the audit
builds it in process (``full_state(build_trainer(recipe, config, seed), …, 0)``, ``jobs.canonical.state_sha256``).
"""

from __future__ import annotations

import json
import sys


def build(request: dict) -> dict:
    import importlib

    from trainmaster.jobs.canonical import state_sha256
    from trainmaster.jobs.devices import cpu_capability, replaying_on
    from trainmaster.jobs.execution import build_trainer, full_state
    from trainmaster.jobs.recipe import Recipe
    from trainmaster.jobs.recipes import get_recipe

    name = request["recipe"]
    if ":" in name:
        module, _, attr = name.partition(":")
        recipe = getattr(importlib.import_module(module), attr)
        if not isinstance(recipe, Recipe):
            raise TypeError(f"{name} is a {type(recipe).__name__}, not a Recipe")
    else:
        recipe = get_recipe(name)
    seed = int(request["seed"])
    with replaying_on(request.get("device")):
        cfg = recipe.config(dict(request["config"]))
        state = full_state(build_trainer(recipe, cfg, seed), recipe, cfg, seed, 0)
    return {"kernels": cpu_capability(), "weights_sha256": state_sha256(state.weights),
            "rest_sha256": state_sha256(state.rest)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainmaster.verify.initial_child ANSWER.json < REQUEST.json", file=sys.stderr)
        return 2
    answer = build(json.loads(sys.stdin.read()))
    with open(argv[0], "w", encoding="ascii") as out:
        out.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
