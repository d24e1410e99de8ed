"""TRAINMASTER_DATABASE_URL: unset, the home's state.db; `sqlite:////abs/path.db`, that file; `postgresql://…`, the
server (psycopg imported only then); anything else, one clear error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainmaster.broker import paths
from trainmaster.storage import statedb


def test_unset_is_the_homes_state_db(tm_home, monkeypatch):
    monkeypatch.delenv("TRAINMASTER_DATABASE_URL", raising=False)
    assert paths.state_db() == tm_home / "state.db"


def test_a_sqlite_url_names_an_absolute_file(tm_home, tmp_path, monkeypatch):
    from trainmaster.broker.store import Store

    monkeypatch.setenv("TRAINMASTER_DATABASE_URL", f"sqlite:///{tmp_path}/elsewhere/state.db")
    assert paths.state_db() == tmp_path / "elsewhere" / "state.db"
    Store(paths.state_db()).close()
    assert (tmp_path / "elsewhere" / "state.db").is_file() and not (tm_home / "state.db").exists()
    with pytest.raises(statedb.BadDatabaseUrl, match="absolute path"):
        statedb.location("sqlite:///relative.db")


@pytest.mark.parametrize("url", ["mysql://x/db", "state.db", "postgresq://typo"])
def test_other_urls_are_refused(url):
    with pytest.raises(statedb.BadDatabaseUrl, match="sqlite:////absolute/path.db or postgresql://"):
        statedb.location(url)


def test_a_postgresql_url_is_kept_and_shown_without_its_password():
    url = "postgresql://tm:s3cret@db.example:5432/trainmaster"
    assert statedb.location(url) == url and statedb.is_server(url)
    assert statedb.shown(url) == "postgresql://tm:***@db.example:5432/trainmaster"
    assert not statedb.is_server(Path("/x/state.db")) and statedb.shown(Path("/x/state.db")) == "/x/state.db"


def test_sqlite_never_imports_the_postgresql_driver(tmp_path):
    import subprocess

    code = ("import sys; from trainmaster.broker.store import Store; Store(sys.argv[1]).close();"
            " print('psycopg' in sys.modules, 'trainmaster.storage.dialects.postgresql' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state.db")], capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr
