"""Names and reasons from outside reach the terminal with every control character made visible, so a
file name cannot clear the screen and paint a fake verdict, on a terminal or in a pipe."""

from __future__ import annotations

import json
import pickle
import re

from cli_run import tm

from trainmaster.broker.cli.safe_text import markup, visible

FAKE = "\x1b[2J\x1b[H ACCEPTED"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")  # newline and tab may separate our own lines


def test_visible_escapes_c0_del_c1_and_bidi_controls():
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("\x9b31m\x9d0;t\x07") == "\\x9b31m\\x9d0;t\\x07"
    assert visible("line\nnext\ttab\r\x7f") == "line\\x0anext\\x09tab\\x0d\\x7f"
    assert visible("evil\u202etxt.exe") == "evil\\u202etxt.exe"
    assert visible("plain name é 模型.safetensors") == "plain name é 模型.safetensors"
    assert markup("[bold]x[/bold]\x1b") == "\\[bold]x\\[/bold]\\x1b"


def test_verify_dir_shows_a_screen_clearing_name_escaped_and_still_rejected(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{FAKE}\x9b2J.pkl").write_bytes(pickle.dumps({"a": 1}))
    (out / "x\n  - all checks passed.pt").write_bytes(b"not a model")
    result = tm("verify", str(out), home=tmp_path / "home")
    assert result.returncode == 1
    shown = result.stdout + result.stderr
    assert not RAW_CONTROL.search(shown)
    assert "REJECTED" in shown and "\\x1b[2J\\x1b[H ACCEPTED\\x9b2J.pkl" in shown
    assert "x\\x0a  - all checks passed.pt" in shown  # a newline cannot start a fake reason line
    assert json.loads(tm("verify", str(out), "--json", home=tmp_path / "home").stdout)["outcome"] == "rejected"


WRITES_HOSTILE_NAMES = """
import os, pathlib
out = pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'])
(out / 'out.txt').write_text('ok')
(out / 'a\\x1b]0;owned\\x07[red]b[/red].txt').write_text('x')
"""


def test_status_and_verify_show_escape_names_a_job_returned(job_factory, tmp_path):
    home = tmp_path / "home"
    spec = job_factory(WRITES_HOSTILE_NAMES)
    submitted = tm("submit", str(spec), "--wait", home=home)
    job_id = json.loads(tm("ls", "--all", "--json", home=home).stdout)[0]["id"]
    for args in (["status", job_id], ["verify", job_id], ["ls", "--all"]):
        result = tm(*args, home=home)
        shown = result.stdout + result.stderr
        assert not RAW_CONTROL.search(shown), (args, shown)
    status = tm("status", job_id, home=home).stdout + tm("verify", job_id, home=home).stdout
    assert "a\\x1b]0;owned\\x07[red]b[/red].txt" in status  # shown as written, markup not applied
    assert not RAW_CONTROL.search(submitted.stdout.split("[trainmaster]")[0] + submitted.stderr)


def test_an_error_naming_a_hostile_reference_is_escaped(tmp_path):
    result = tm("status", "no-such\x1b[2J-job", home=tmp_path / "home")
    assert result.returncode == 2 and "\\x1b[2J" in result.stderr and not RAW_CONTROL.search(result.stderr)


def test_an_error_of_several_problems_keeps_one_per_line_and_escapes_each(job_factory, tmp_path):
    spec = job_factory("print(1)\n", "resources:\n  gpu: 1\n  \"x\\e]0;t\\a\": 2\n")  # an OSC in a key
    out = tm("submit", str(spec), home=tmp_path / "home")
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if "job.yaml:" in line]
    assert len(lines) == 2 and not RAW_CONTROL.search(out.stderr) and "x\\x1b]0;t\\x07" in out.stderr
