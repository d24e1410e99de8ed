"""Shared fixtures: every test gets its own TRAINMASTER_HOME, so state never leaks between tests; and how `./dev test`
spreads the suite over its workers (the groups below).

Test files mirror the package's folders (tests/repo/test_layout.py) and are imported by their file name
(`--import-mode=prepend`); the helpers beside this file are importable from every folder (`pythonpath = ["tests"]`,
pyproject.toml)."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
"""OpenMP's idle threads sleep instead of spinning, in the workers and every process they start (read when torch loads
its OpenMP runtime, so set before any test imports torch). By default an idle thread of torch's intra-op pool spins
for milliseconds between parallel regions: harmless alone, but the suite keeps more runnable processes than cores,
and there the spin takes the core another process needed. On 2 cores, two processes each training a small MLP on 2
threads used 10.6 CPU-s each spinning and 2.2-2.5 sleeping, and five of the heaviest in-process torch files took
128-138 s instead of 146-163 s, with 220-241 user CPU-s instead of 266. It changes no result: the wait policy is not
in any computation. A value of the caller's own wins."""

SPLIT_FILES = ("test_benchmarks_smoke.py",)
"""Files whose tests are spread one by one: each benchmark's smoke run is independent and the file as one unit
(minutes of smoke runs) would be the longest pole of a parallel run."""
SHARED_GROUPS = {"ray": ("test_ray_backend.py", "test_benchmarks_smoke.py::test_benchmark_smoke[bench_ray]")}
"""Groups of tests (by file name, or file name and test) that share one server: they run together on one worker (and
side by side with `-n 0`), so the server starts once for all of them and stops after the last
(`pytest_runtest_teardown`).
ray: the two-node Ray cluster (tests/ray_cluster.py `shared`, the `ray_cluster` fixture), ~40 s to start."""


def _group(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    base = file.rsplit("/", 1)[-1]  # the file's name: the same in whichever folder it sits
    for name, members in SHARED_GROUPS.items():
        if base in members or base + nodeid[len(file):] in members:
            return name
    return nodeid if file.endswith(SPLIT_FILES) else file


GROUP = pytest.StashKey[str]()
"""An item's group (`_group`), kept on the item."""


def pytest_collection_modifyitems(config, items):
    """Groups (`_group`): a file's tests form one, except in SPLIT_FILES (one each) and SHARED_GROUPS (one for all
    their members). The items are ordered group by group, the groups with the most `slow` tests first (the order
    in which `./dev test` hands them to the workers: the longest first, so none is left to run alone at the end),
    each group where its first test stood otherwise."""
    groups: dict[str, list] = {}
    for item in items:
        item.stash[GROUP] = _group(item.nodeid)
        groups.setdefault(item.stash[GROUP], []).append(item)
    slow = {name: sum(1 for item in members if item.get_closest_marker("slow")) for name, members in groups.items()}
    order = sorted(groups, key=lambda name: -slow[name])  # stable: collection order among equals
    items[:] = [item for name in order for item in groups[name]]


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (./dev test) with these groups, each sent whole to one worker in the order above. xdist's
    own loadgroup reads `xdist_group` marks through a node id suffix that pytest 9 no longer keeps: with it every
    test was a unit of its own, a file's tests ran on both workers, and a module-scoped fixture (a server, a trained
    run) was set up again every time another file's test ran in between on the same worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False  # the collection's order: the longest groups first

        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return Groups(config, log)


def pytest_configure(config):
    """With `TRAINMASTER_SUITE_CPU` set (tests/benchmarks/bench_suite.py), each test's CPU is recorded there
    (tests/suite_cpu.py). A process that runs tests (an xdist worker, or a run without workers) then drops the
    variable, so a pytest a test starts (tests/repo/test_suite_groups.py, bench_cloud_requests.py) records nothing
    twice: its CPU is already the starting test's."""
    import suite_cpu

    folder = os.environ.get(suite_cpu.ENV)
    if folder:
        config.pluginmanager.register(suite_cpu.Recorder(Path(folder)), "suite_cpu")
        if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
            del os.environ[suite_cpu.ENV]


def pytest_runtest_teardown(item, nextitem):
    """A shared group's server stops once the next test on this worker is not of its group."""
    import sys

    if item.stash.get(GROUP, None) == "ray" and (nextitem is None or nextitem.stash.get(GROUP, None) != "ray"):
        cluster = sys.modules.get("ray_cluster")
        if cluster is not None:
            cluster.stop_shared()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report ends with what the machine was doing then (tests/machine_load.py)."""
    report = yield
    if report.failed:
        import machine_load

        try:
            report.sections.append(("the machine when it failed", machine_load.describe()))
        except Exception as exc:  # a diagnosis only: it never hides the failure itself
            report.sections.append(("the machine when it failed", f"not read: {type(exc).__name__}: {exc}"))
    return report


@pytest.fixture
def ray_cluster():
    """The Ray cluster this worker's "ray" group shares (tests/ray_cluster.py): started by the first test that asks,
    stopped after the group's last test; a missing `ray` fails the test."""
    from ray_cluster import shared

    return shared()


def pytest_sessionfinish(session, exitstatus):
    """The cloud fakes' tally of requests checked against the services' rules, for bench_cloud_requests.py; the
    background passes reads started in the session's temporary folders are stopped."""
    import sys

    checked = sys.modules.get("clouds.checked")
    if checked is not None:
        checked.write_report()
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None and "background_support" in sys.modules:  # a read started a background pass somewhere
        sys.modules["background_support"].stop_all_under(factory.getbasetemp())


@pytest.fixture
def tm_home(tmp_path_factory, monkeypatch) -> Iterator[Path]:
    """Beside the test's tmp_path, not in it: a code dir holding the home is refused (it would bundle state.db)."""
    from background_support import stop_background

    home = tmp_path_factory.mktemp("home") / "home"
    monkeypatch.setenv("TRAINMASTER_HOME", str(home))
    yield home
    stop_background(home)  # the background pass a read started, if it still runs (broker/cli/background.py)


@pytest.fixture
def broker(tm_home):
    """A broker on the test's own state, driven synchronously (tests/broker_support.py)."""
    from broker_support import sync_broker

    b = sync_broker()
    yield b
    b.close()


def write_job(root: Path, script: str, spec: str = "", *, name: str = "t", entrypoint: str = "python train.py") -> Path:
    """A code dir with `train.py` and a `job.yaml` next to it; returns the spec path."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(textwrap.dedent(script))
    body = f"name: {name}\nentrypoint: {entrypoint}\n" + textwrap.dedent(spec)
    (root / "job.yaml").write_text(body)
    return root / "job.yaml"


@pytest.fixture
def job_factory(tmp_path):
    counter = iter(range(10_000))

    def make(script: str, spec: str = "", **kw) -> Path:
        return write_job(tmp_path / f"job{next(counter)}", script, spec, **kw)

    return make


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the session (tests/postgres_server.py); missing binaries fail the test."""
    from postgres_server import MissingServer, PostgresServer

    try:
        server = PostgresServer().start()
    except MissingServer as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.database()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path, monkeypatch):
    """Where the state lives, once per database: a SQLite file, then a fresh PostgreSQL database (also set as
    TRAINMASTER_DATABASE_URL, so whatever opens the state through `paths.state_db()` uses it, with the shared
    storage a broker on a server needs: a folder beside the test's)."""
    if request.param == "sqlite":
        return tmp_path / "state.db"
    url = request.getfixturevalue("postgres_url")
    monkeypatch.setenv("TRAINMASTER_DATABASE_URL", url)
    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("TRAINMASTER_SHARED_STORAGE", str(tmp_path / "shared"))
    return url


@pytest.fixture
def served(tmp_path):
    """The dashboard's routes over a state with known jobs and a $10 monthly budget (tests/observe_support.py),
    served on 127.0.0.1; `served.filler` changes that state."""
    from observe_support import known_state, serve
    from trainmaster.wallet.budget import Budget

    filler = known_state(tmp_path / "home")
    app = serve(filler.path, [Budget(cap="10", period="month")])
    app.filler = filler
    yield app
    app.stop()
    filler.close()
