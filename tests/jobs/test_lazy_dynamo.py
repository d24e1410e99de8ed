"""torch._dynamo is loaded only when something compiles (jobs/lazy_dynamo.py): a recipe's optimizer steps the
same bytes without it, and whatever does use dynamo (torch.compile, a submodule's import, its attributes) gets the
real package, loaded once, compiling as it would have. Each case runs in a fresh interpreter, which reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

STEPS = textwrap.dedent("""
    import hashlib, json, sys
    import torch
    import trainmaster.jobs.recipe  # what every recipe's process imports: it defers dynamo
    from trainmaster.jobs import lazy_dynamo
    digest = hashlib.sha256()
    for name, kwargs in [("SGD", {"lr": 0.05, "momentum": 0.9}), ("Adam", {"lr": 0.01}), ("AdamW", {"lr": 0.01})]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        for _ in range(5):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
        optimizer.load_state_dict(optimizer.state_dict())
        optimizer.step()
        for tensor in [*model.state_dict().values(), *[v for s in optimizer.state.values() for v in s.values()]]:
            digest.update(tensor.detach().numpy().tobytes())
    probed = [hasattr(sys.modules["torch._dynamo"], name) for name in ("__wrapped__", "__getstate__", "__test__")]
    print(json.dumps({"digest": digest.hexdigest(), "loaded": "torch._dynamo.eval_frame" in sys.modules,
                      "reported": lazy_dynamo.loaded(), "probed": probed}))
""")

COMPILE = textwrap.dedent("""
    import json, sys
    import torch
    import trainmaster.jobs.recipe
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    model(x).sum().backward()
    optimizer.step()  # marked (disable) while deferred, where the stand-in is in place
    deferred = "torch._dynamo.eval_frame" not in sys.modules

    def train_step():
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

    step = torch.compile(train_step, backend="eager")
    for _ in range(3):
        step()
    from torch._dynamo.utils import counters
    print(json.dumps({"deferred": deferred, "weights": model.weight.detach().tolist(),
                      "graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
                      "real": type(torch._dynamo) is type(torch) and sys.modules["torch._dynamo"] is torch._dynamo}))
""")

SUBMODULE = textwrap.dedent("""
    import importlib.machinery, json, sys
    import torch
    from trainmaster.jobs import lazy_dynamo
    installed = lazy_dynamo.defer()
    import torch._dynamo.config as config
    import torch._dynamo
    from torch._dynamo import reset
    print(json.dumps({"installed": installed, "same": config is torch._dynamo.config is sys.modules[config.__name__],
                      "loader": type(config.__spec__.loader).__name__, "real": type(torch._dynamo) is type(torch),
                      "reset": reset is torch._dynamo.reset, "again": lazy_dynamo.defer()}))
""")

ALREADY = textwrap.dedent("""
    import json, os, sys
    import torch
    from trainmaster.jobs import lazy_dynamo
    os.environ["TRAINMASTER_EAGER_DYNAMO"] = "1"
    eager = lazy_dynamo.defer(), "torch._dynamo" in sys.modules
    del os.environ["TRAINMASTER_EAGER_DYNAMO"]
    import torch._dynamo
    print(json.dumps({"eager": eager, "installed": lazy_dynamo.defer(),
                      "real": type(sys.modules["torch._dynamo"]) is type(torch)}))
""")


def _run(code: str, *, eager: bool = False) -> dict:
    env = {**os.environ, "TRAINMASTER_EAGER_DYNAMO": "1" if eager else ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_optimizers_step_the_same_bytes_without_loading_dynamo():
    """SGD with momentum, Adam and AdamW: steps, a state-dict round trip, a step after it. Deferred, the weights and
    moments are byte-identical to a process with dynamo loaded (TRAINMASTER_EAGER_DYNAMO=1), and dynamo is not, even
    after the module's dunders were probed."""
    deferred, eager = _run(STEPS), _run(STEPS, eager=True)
    assert deferred["digest"] == eager["digest"]
    assert deferred["probed"] == eager["probed"]  # a module's dunders probed (inspect, pickle): no load, same answer
    assert (deferred["loaded"], deferred["reported"]) == (False, False)
    assert (eager["loaded"], eager["reported"]) == (True, True)


def test_torch_compile_after_deferral_loads_dynamo_and_compiles_as_before():
    """A train step compiled after the optimizer stepped deferred: the real package is loaded, the same graphs and
    graph breaks are made (its methods marked for real as it loads), and the weights are those of the eager case."""
    deferred, eager = _run(COMPILE), _run(COMPILE, eager=True)
    assert deferred["deferred"] and not eager["deferred"]
    assert deferred["real"] and eager["real"]
    assert (deferred["graphs"], deferred["breaks"]) == (eager["graphs"], eager["breaks"])
    assert deferred["weights"] == eager["weights"]


def test_a_submodule_import_loads_the_real_package_once():
    """`import torch._dynamo.config` while deferred: the package's own __init__ runs first, and the submodule is the
    one it loaded (not a second copy with its own settings), keeping its own spec."""
    result = _run(SUBMODULE)
    assert result == {"installed": True, "same": True, "loader": "SourceFileLoader", "real": True, "reset": True,
                      "again": False}, result


def test_nothing_is_deferred_where_dynamo_is_loaded_or_eager_loading_is_asked():
    assert _run(ALREADY) == {"eager": [False, False], "installed": False, "real": True}
