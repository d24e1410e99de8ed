"""`offers`, `spend` and `policy check | show`, through a Typer app with `register` applied."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from clouds.ready import ready_clouds  # noqa: F401 - the fixture
from trainmaster.broker.cli.cost import register

ENV = {"COLUMNS": "200"}


@pytest.fixture
def cli(tm_home):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """The test app."""

    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args), env=ENV)


@pytest.fixture
def training_job(job_factory, ready_clouds):
    """A training job, the three clouds set up enough to be planned (clouds/ready.py)."""
    return job_factory("print('train')\n", textwrap.dedent("""
        workload: initial_training
        estimated_hours: 50
        resources: {gpus: 8, gpu_types: [A100]}
    """))


def test_policy_check_valid_invalid_missing(cli, tmp_path):
    from importlib import resources

    hybrid = str(resources.files("trainmaster.configs") / "hybrid.yaml")
    ok = cli("policy", "check", hybrid)
    assert ok.exit_code == 0 and "valid policy 'hybrid'" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: b\ndefault:\n  primary: local\n  objectve: fastest\n")
    result = cli("policy", "check", str(bad))
    assert result.exit_code == 1
    assert f"{bad}:4: default.objectve: unknown field; did you mean 'objective'?" in result.stderr
    as_json = json.loads(cli("policy", "check", str(bad), "--json").stdout)
    assert as_json["valid"] is False and as_json["problems"][0].startswith(f"{bad}:4:")
    assert cli("policy", "check", str(tmp_path / "none.yaml")).exit_code == 2


def test_policy_show(cli):
    shown = cli("policy", "show", "hybrid")
    assert shown.exit_code == 0
    assert "bittensor → aws:spot" in shown.stdout and "all spend per month" in shown.stdout
    assert "shipped policies: cloud-only, default, hybrid, privacy-first" in shown.stdout
    data = json.loads(cli("policy", "show", "hybrid", "--json").stdout)
    assert data["classes"]["initial_training"]["primary"] == ["bittensor"]
    assert data["classes"]["initial_training"]["fallbacks"] == [["aws:spot"]]
    assert data["budgets"][0]["cap"] == "3000"
    assert "local" in cli("policy", "show").stdout
    missing = cli("policy", "show", "nope")
    assert missing.exit_code == 2 and "no policy named 'nope'" in missing.stderr


CLOUDS = ("aws", "gcp", "azure")


def test_offers_plans_the_clouds_from_their_catalog_prices_like_any_backend(cli, training_job):
    from trainmaster.broker.planning.planner import CHOSEN

    result = cli("offers", str(training_job), "--policy", "cloud-only", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    rows = data["considered"]
    assert {r["offer"]["backend"] for r in rows} == set(CLOUDS)
    [best] = [r for r in rows if r["verdict"] == CHOSEN]
    assert data["chosen"] == best["key"] and best["offer"]["backend"] in CLOUDS
    assert best["offer"]["spot"] and best["offer"]["gpu_count"] == 8
    assert best["offer"]["detail"]["price_source"] == "catalog"
    # the cheapest of the 8×A100 spot offers
    spot = [r for r in rows if r["offer"]["spot"]]
    assert all(r["expected_micro_usd"] >= best["expected_micro_usd"] for r in spot)


def test_offers_warns_of_a_stale_catalog(cli, training_job, tm_home):
    catalogs = tm_home / "config" / "catalogs"
    catalogs.mkdir(parents=True)
    (catalogs / "aws.csv").write_text(
        "# date: 2020-01-01\n"
        "cloud,instance,region,gpu_type,gpu_count,gpu_memory_gb,vcpus,memory_gb,on_demand_usd_per_hour,spot_usd_per_hour\n"
        "aws,p4d.24xlarge,us-east-1,A100,8,40,96,1152,20,1.50\n"
    )
    shown = cli("offers", str(training_job), "--policy", "hybrid")
    data = json.loads(cli("offers", str(training_job), "--policy", "hybrid", "--json").stdout)
    override = [w for w in data["warnings"] if w.startswith(f"{catalogs / 'aws.csv'}: prices dated 2020-01-01")]
    assert len(override) == 1 and len(set(data["warnings"])) == len(data["warnings"]), data["warnings"]
    # on stderr, every stale catalog once, in one line of the command's own (#33 §5)
    said = " ".join(line.strip() for line in shown.stderr.splitlines() if line.strip())
    assert said.startswith("warning: price catalogs older than 90 days") and said.count("warning:") == 1, said
    assert f"{catalogs / 'aws.csv'} (2020-01-01," in said and "backends/catalog/aws.csv (" in said, said


def test_offers_table_marks_catalog_prices_and_bittensor_has_a_reason(cli, training_job):
    # a job that commits to its states (a runtime recipe), so Bittensor is asked at all (broker/auditability.py)
    training_job.write_text(training_job.read_text().replace("entrypoint: python train.py",
                                                             "entrypoint: python -m trainmaster.jobs.recipes.dqn"))
    result = cli("offers", str(training_job), "--policy", "hybrid")
    assert "p4d.24xlarge" in result.stdout
    assert re.search(r"catalog list price \(dated \d{4}-\d{2}-\d{2}\), not a live quote", result.stdout)
    assert "bittensor: no TAO/USD rate: set the policy's tao_rate" in result.stdout  # dispatchable, but unpriced


def test_offers_prefers_the_users_override(cli, training_job, tm_home):
    from trainmaster.broker.planning.planner import CHOSEN

    catalogs = tm_home / "config" / "catalogs"
    catalogs.mkdir(parents=True)
    (catalogs / "aws.csv").write_text(
        "# date: 2026-11-01\n"
        "cloud,instance,region,gpu_type,gpu_count,gpu_memory_gb,vcpus,memory_gb,on_demand_usd_per_hour,spot_usd_per_hour\n"
        "aws,p4d.24xlarge,us-east-1,A100,8,40,96,1152,20,1.50\n"
    )
    data = json.loads(cli("offers", str(training_job), "--policy", "hybrid", "--json").stdout)
    best = next(r for r in data["considered"] if r["verdict"] == CHOSEN)
    assert best["key"] == "aws/us-east-1/p4d.24xlarge/spot"
    assert best["offer"]["price_per_hour_micro_usd"] == 1_500_000
    assert best["offer"]["detail"]["catalog_date"] == "2026-11-01"


def test_offers_and_dry_run_check_budgets_as_submit_does(cli, job_factory, tmp_path):
    from typer.testing import CliRunner

    from trainmaster.broker.cli import app

    policy = tmp_path / "tight.yaml"
    policy.write_text("name: tight\ndefault:\n  primary: local\nbudgets:\n  - name: tiny\n    period: total\n    cap: 0.01\n")
    spec = job_factory("print()\n", "limits:\n  max_hours: 10\n")  # 10 h on this machine: over $0.01
    shown = cli("offers", str(spec), "--policy", str(policy), "--json")
    assert shown.exit_code == 1 and json.loads(shown.stdout)["chosen"] is not None
    assert "refused by budget" in json.loads(shown.stdout)["budget"] and "tiny" in json.loads(shown.stdout)["budget"]
    dry = CliRunner().invoke(app, ["submit", str(spec), "--policy", str(policy), "--dry-run"], env=ENV)
    assert dry.exit_code == 1 and "submit would fail the job: refused by budget" in dry.output
    real = CliRunner().invoke(app, ["submit", str(spec), "--policy", str(policy), "--json"], env=ENV)
    assert json.loads(real.output)["state"] == "failed"  # what the preview said


def test_offers_bad_override_is_an_environment_error(cli, training_job, tm_home):
    catalogs = tm_home / "config" / "catalogs"
    catalogs.mkdir(parents=True)
    (catalogs / "gcp.csv").write_text("# date: 2026-11-01\ncloud,instance\n")
    result = cli("offers", str(training_job), "--policy", "cloud-only")
    assert result.exit_code == 2 and "gcp.csv:2: missing column(s)" in result.stderr


def test_offers_exit_codes(cli, job_factory, tmp_path):
    huge = job_factory("print()\n", "resources: {gpus: 64}\n")
    result = cli("offers", str(huge))
    assert result.exit_code == 1
    assert "no offer can run this development" in result.stdout and "needs 64 GPU(s)" in result.stdout
    assert cli("offers", str(tmp_path / "nope.yaml")).exit_code == 2
    invalid = job_factory("print()\n", "resourcs: {gpus: 1}\n")
    bad = cli("offers", str(invalid))
    assert bad.exit_code == 1 and "did you mean 'resources'" in bad.stderr
    assert cli("offers", str(huge), "--policy", "nope").exit_code == 2


def _charged(tm_home) -> None:
    from trainmaster.wallet.ledger import Ledger

    with Ledger(tm_home / "state.db") as ledger:
        for i, (backend, usd) in enumerate([("aws", 12_500_000), ("bittensor", 3_000_000), ("aws", 1_000_000)]):
            ledger.reserve(f"r{i}", job_id=f"j{i}", backend=backend, workload="retraining", micro_usd=20_000_000)
            ledger.charge(f"c{i}", reservation_key=f"r{i}", micro_usd=usd)
        ledger.reserve("open", job_id="j9", backend="gcp", workload="retraining", micro_usd=50_000_000)


def test_spend_reports_charges(cli, tm_home, tmp_path):
    empty = json.loads(cli("spend", "--json").stdout)
    assert empty == [{"group": "total", "usd": "0", "micro_usd": 0, "rao": 0, "charges": 0, "unsent_payments": 0,
                      "unsent_rao": 0}]
    assert not (tm_home / "state.db").exists()  # reading creates nothing
    _charged(tm_home)
    by_backend = json.loads(cli("spend", "--by", "backend", "--json").stdout)
    assert [(r["group"], r["usd"], r["charges"]) for r in by_backend] == [("aws", "13.5", 2), ("bittensor", "3", 1)]
    table = cli("spend", "--by", "backend")
    assert table.exit_code == 0 and "$13.50" in table.stdout and "$16.50" in table.stdout  # the total row
    plot = tmp_path / "spend.png"
    assert cli("spend", "--by", "job", "--plot", str(plot)).exit_code == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wrong = cli("spend", "--by", "region")
    assert wrong.exit_code == 2 and "cannot group spend by 'region'" in wrong.stderr


def test_importing_the_commands_stays_light():
    code = ("import sys, trainmaster.broker.cli.cost; "
            "print(sorted(m for m in ('pydantic', 'rich', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
