"""The real CLI with its state on a PostgreSQL server (TRAINMASTER_DATABASE_URL, with the shared storage such a
broker needs): a small local job is submitted and accepted, listed, and its spend read; the rows are in
PostgreSQL and no state.db is written."""

from __future__ import annotations

import json

from cli_run import tm

from trainmaster.storage import statedb

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


def test_submit_ls_spend_on_postgresql(tmp_path, job_factory, postgres_url):
    home, shared = tmp_path / "home", tmp_path / "shared"
    shared.mkdir()
    env = {"TRAINMASTER_DATABASE_URL": postgres_url, "TRAINMASTER_SHARED_STORAGE": str(shared)}
    spec = job_factory(TRAIN)
    submitted = tm("submit", str(spec), "--wait", "--json", home=home, extra_env=env)
    assert submitted.returncode == 0, submitted.stderr
    listed = tm("ls", "--all", "--limit", "0", "--json", home=home, extra_env=env)  # 0: every job
    jobs = json.loads(listed.stdout)
    assert [j["state"] for j in jobs] == ["accepted"], listed.stderr
    spend = tm("spend", "--json", home=home, extra_env=env)
    assert spend.returncode == 0, spend.stderr
    db = statedb.connect(postgres_url)
    try:
        assert db.execute("SELECT id, state FROM jobs").fetchall() == [(jobs[0]["id"], "accepted")]
        kinds = sorted(r[0] for r in db.execute("SELECT kind FROM ledger_entries WHERE job_id = ?", (jobs[0]["id"],)))
        assert kinds == ["charge", "reserve"]
        assert db.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0] >= 1
    finally:
        db.close()
    assert not (home / "state.db").exists()
    assert any(path.is_file() for path in shared.rglob("*"))  # the bundle and outputs, where every host finds them


def test_a_server_that_is_down_is_one_clear_error_without_the_password(tmp_path):
    from postgres_server import _free_port

    url = f"postgresql://tm:s3cret@127.0.0.1:{_free_port()}/nothing"
    out = tm("ls", home=tmp_path / "home", extra_env={"TRAINMASTER_DATABASE_URL": url})
    assert out.returncode == 2, out.stderr
    assert "cannot open the state database postgresql://tm:***@127.0.0.1" in out.stderr
    assert "TRAINMASTER_DATABASE_URL" in out.stderr and "s3cret" not in out.stderr + out.stdout


def test_a_bad_database_url_is_one_clear_error(tmp_path):
    out = tm("ls", home=tmp_path / "home", extra_env={"TRAINMASTER_DATABASE_URL": "mysql://x"})
    assert out.returncode != 0 and "TRAINMASTER_DATABASE_URL" in out.stderr + out.stdout, out.stderr
