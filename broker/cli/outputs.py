"""`trainmaster outputs JOB [--dest DIR] [--json]`: copy an accepted job's outputs into a folder, each file's size
and sha256 checked against the database's record, from the shared storage they were put in
(broker/filekeeping/shared_outputs.py), or from this host's home when they were not shared.

Module-level imports stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from trainmaster.broker.cli.exits import BAD, console, escape, fail, guarded


def register(app: typer.Typer) -> None:
    app.command()(outputs)


def outputs(
    job_id: str = typer.Argument(..., help="Job id or a unique prefix."),
    dest: Path = typer.Option(None, "--dest", "-d", help="Folder to write them in (default: ./JOB_ID)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Download an accepted job's outputs (from the shared storage, or this host's home), checking each file's
    sha256 against the one recorded when it was accepted. Works from any host sharing the state database."""
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    try:
        job, files, shared = guarded(lambda: _accepted(store, job_id))
    finally:
        store.close()
    if files is None:
        fail(f"{job.id} is {job.state}: only an accepted job's outputs are kept", BAD)
    folder = (dest or Path.cwd() / job.id).absolute()
    where = guarded(lambda: _download(job.id, files, shared, folder))
    if as_json:
        print(json.dumps({"job": job.id, "from": where, "dest": str(folder),
                          "files": [{"path": p, "size": s, "sha256": h} for p, s, h in files]}, indent=2))
        return
    console().print(f"{escape(job.id)}: {len(files)} files ({sum(s for _, s, _ in files):,} bytes) from "
                    f"{escape(where)} into {escape(str(folder))}, each sha256 checked", highlight=False, soft_wrap=True)


def _accepted(store, job_ref: str):
    """(the job, its accepted attempt's recorded outputs or None when it was not accepted, the `shared` event's detail)."""
    from trainmaster.broker.filekeeping.shared_outputs import recorded

    job = store.find_job(job_ref)
    attempt = next((a for a in store.attempts(job.id) if a.state == "accepted" and store.outputs(a.id)), None)
    if job.state != "accepted" or attempt is None:
        return job, None, None
    return job, store.outputs(attempt.id), recorded(store, job.id)


def _download(job_id: str, files, shared: dict | None, folder: Path) -> str:
    """Download every file (a bar per large file, on a terminal); returns where they were read from."""
    import asyncio

    from trainmaster.broker.filekeeping import shared_outputs
    from trainmaster.broker.cli.transfer_bar import TransferBar

    store, where = shared_outputs.source(shared)
    asyncio.run(shared_outputs.download(store, job_id, files, folder, progress_for=TransferBar))
    return where
