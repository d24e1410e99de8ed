"""What `submit` and `spend` refuse or say, through the real CLI (#16 §8): `--dry-run` refuses an entrypoint
command not on the job's PATH, a script outside the bundle and a deadline already past; no
`Workload.development` in a plan; `submit DIR` takes its job.yaml; `spend --plot` says where it wrote
and `spend --help` says that failed local attempts are charged too."""

from __future__ import annotations

import json

from cli_run import tm

HI = "print('hi')\n"


def test_dry_run_refuses_a_command_not_on_the_jobs_path(tm_home, job_factory):
    out = tm("submit", str(job_factory(HI, entrypoint="no-such-trainer --epochs 3")), "--dry-run", home=tm_home)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "entrypoint: the command 'no-such-trainer' is not on the job's PATH" in out.stderr, out.stderr


def test_dry_run_refuses_a_script_outside_the_bundle(tm_home, job_factory, tmp_path):
    (tmp_path / "elsewhere.py").write_text(HI)
    for script in ("../elsewhere.py", str(tmp_path / "elsewhere.py")):
        out = tm("submit", str(job_factory(HI, entrypoint=f"python {script}")), "--dry-run", home=tm_home)
        assert out.returncode != 0 and f"entrypoint: {script} is outside the code directory" in out.stderr, out.stderr


def test_dry_run_refuses_a_deadline_already_past(tm_home, job_factory):
    spec = job_factory(HI, "limits:\n  deadline: 2020-01-01T00:00:00Z\n")
    out = tm("submit", str(spec), "--dry-run", home=tm_home)
    assert out.returncode != 0 and "limits.deadline: 2020-01-01T00:00:00+00:00 is already past" in out.stderr, out.stderr
    assert "expected to finish after the deadline" not in out.stderr + out.stdout


def test_a_command_on_path_and_a_future_deadline_pass(tm_home, job_factory):
    spec = job_factory(HI, "estimated_hours: 0.001\nlimits:\n  deadline: 2999-01-01T00:00:00Z\n",
                       entrypoint="bash -c 'python train.py'")
    assert tm("submit", str(spec), "--dry-run", home=tm_home).returncode == 0


def test_no_enum_names_leak_into_plans(tm_home, job_factory):
    spec = job_factory(HI, "estimated_hours: 0.001\n")
    for command in (("submit", str(spec), "--dry-run"), ("submit", str(spec), "--dry-run", "--json"),
                    ("offers", str(spec), "--json")):
        out = tm(*command, home=tm_home)
        assert out.returncode == 0 and "Workload." not in out.stdout and "Precision." not in out.stdout, out.stdout
    assert json.loads(tm("offers", str(spec), "--json", home=tm_home).stdout)["workload"] == "development"


def test_spec_defaults_are_plain_values():
    from trainmaster.jobs.spec import JobSpec

    spec = JobSpec(name="a", entrypoint="python a.py")
    assert type(spec.workload) is str and f"{spec.workload}/{spec.precision}" == "development/fp32"


def test_submit_of_a_directory_takes_its_job_yaml_or_says_it_has_none(tm_home, job_factory, tmp_path):
    spec = job_factory(HI, "estimated_hours: 0.001\n")
    planned = tm("submit", str(spec.parent), "--dry-run", "--json", home=tm_home)
    assert planned.returncode == 0 and json.loads(planned.stdout)["name"] == "t", planned.stderr
    (tmp_path / "empty").mkdir()
    out = tm("submit", str(tmp_path / "empty"), home=tm_home)
    assert out.returncode == 2 and "is a directory with no job.yaml in it" in out.stderr, out.stderr


def test_spend_plot_says_where_it_wrote_and_help_says_what_is_charged(tm_home, tmp_path):
    out = tm("spend", "--plot", str(tmp_path / "spend.png"), home=tm_home)
    assert out.returncode == 0 and (tmp_path / "spend.png").is_file()
    assert f"plot written to {tmp_path / 'spend.png'}" in out.stdout, out.stdout
    scripted = tm("spend", "--json", "--plot", str(tmp_path / "again.png"), home=tm_home)
    assert json.loads(scripted.stdout) and "plot written to" in scripted.stderr  # stdout stays JSON
    shown = tm("spend", "--help", home=tm_home).stdout
    assert "charged on acceptance" not in shown and "failed and cancelled" in " ".join(shown.split()), shown
