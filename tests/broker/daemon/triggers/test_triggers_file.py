"""The triggers file (`triggers.yaml`): what a good one loads to, and each mistake named by file, line and field."""

from __future__ import annotations

import json
import textwrap

import pytest

from cli_run import tm
from trainmaster.broker.daemon.triggers.model import load_triggers, triggers_file, triggers_schema
from trainmaster.jobs.yamlfile import FileError


def write(tmp_path, text: str):
    path = tmp_path / "triggers.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(path) -> list[str]:
    with pytest.raises(FileError) as caught:
        load_triggers(path)
    return caught.value.problems


def test_a_good_file_loads_with_specs_beside_it(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - name: nightly
            spec: agents/job.yaml
            policy: hybrid
            schedule: "0 1 * * *"
            timezone: Europe/Paris
            data: {redis: "redis://127.0.0.1:6379/0", stream: experiences, min_new: 1000}
            debounce_s: 600
          - name: by-hand
            spec: /abs/job.yaml
            manual: true
          - name: uploads
            spec: job.yaml
            data: {prefix: "s3://bucket/incoming", min_new: 5}
        """)
    nightly, by_hand, uploads = load_triggers(path)
    assert nightly.spec == tmp_path / "agents" / "job.yaml" and nightly.policy == "hybrid"
    assert nightly.data.stream == "experiences" and nightly.data.min_new == 1000 and nightly.debounce_s == 600
    assert str(by_hand.spec) == "/abs/job.yaml" and by_hand.manual and by_hand.policy == "default"
    assert uploads.data.prefix == "s3://bucket/incoming" and uploads.budget_gate


def test_no_file_means_no_triggers(tm_home):
    assert triggers_file() == tm_home / "config" / "triggers.yaml"
    assert load_triggers() == []


def test_an_unknown_field_is_named_with_its_line(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - name: nightly
            spec: job.yaml
            schedul: "0 1 * * *"
        """)
    found = problems(path)
    assert any(p.startswith(f"{path}:4: triggers.0.schedul: unknown field; did you mean 'schedule'?") for p in found)


def test_a_bad_cron_a_bad_zone_and_a_bad_threshold_are_each_named(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - name: a
            spec: job.yaml
            schedule: "every night"
            timezone: Mars/Olympus
          - name: b
            spec: job.yaml
            data: {folder: /data, min_new: 0}
        """)
    found = "\n".join(problems(path))
    assert f"{path}:4: triggers.0.schedule: Value error, not a cron expression: 'every night'" in found
    assert f"{path}:5: triggers.0.timezone: Value error, unknown time zone 'Mars/Olympus'" in found
    assert f"{path}:8: triggers.1.data" in found and "min_new" in found


def test_a_trigger_needs_a_condition_and_manual_excludes_them(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - name: a
            spec: job.yaml
          - name: b
            spec: job.yaml
            manual: true
            schedule: "0 1 * * *"
        """)
    found = "\n".join(problems(path))
    assert f"{path}:2: triggers.0: Value error, give a schedule, data, or both (or manual: true)" in found
    assert f"{path}:4: triggers.1: Value error, a manual trigger has no schedule and no data" in found


def test_each_data_source_is_checked(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - {name: a, spec: job.yaml, data: {redis: "http://x", stream: s, min_new: 1}}
          - {name: b, spec: job.yaml, data: {prefix: "ftp://b/p", min_new: 1}}
          - {name: c, spec: job.yaml, data: {redis: "redis://h:1/0", min_new: 1}}
          - {name: d, spec: job.yaml, data: {folder: /x, prefix: "s3://b/p", min_new: 1}}
        """)
    found = problems(path)
    assert f"{path}:2: triggers.0.data.redis: Value error, must be redis://host:port/db" in found[0]
    assert f"{path}:3: triggers.1.data.prefix: Value error, must be s3://bucket/prefix" in found[1]
    assert f"{path}:4: triggers.2.data: Value error, redis and stream go together" in found[2]
    assert f"{path}:5: triggers.3.data: Value error, give exactly one of folder, prefix, or redis" in found[3]


def test_names_are_unique(tmp_path):
    path = write(tmp_path, """\
        triggers:
          - {name: a, spec: job.yaml, schedule: "0 1 * * *"}
          - {name: a, spec: other.yaml, manual: true}
        """)
    assert "triggers: Value error, trigger names must be unique: a" in problems(path)[0]


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "triggers:\n  - name: a\n    spec: [unclosed\n")
    assert problems(path)[0].startswith(f"{path}:4:")


def test_the_schema_describes_the_file(tm_home):
    schema = json.loads(tm("schema", "triggers", home=tm_home).stdout)
    assert schema == json.loads(json.dumps(triggers_schema()))
    assert schema["title"] == "trainmaster triggers" and "triggers" in schema["properties"]
    trigger = schema["$defs"]["Trigger"]
    assert trigger["additionalProperties"] is False
    assert {"name", "spec", "schedule", "data", "debounce_s", "budget_gate", "manual"} <= set(trigger["properties"])
