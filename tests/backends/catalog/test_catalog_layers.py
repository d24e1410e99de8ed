"""The refreshed layer: laid between the shipped catalog and the user's override (shipped < refreshed < user),
dated by its `# refreshed:` timestamp."""

from __future__ import annotations

from datetime import date

import pytest

from trainmaster.backends.catalog import load_catalog
from trainmaster.jobs.yamlfile import FileError

HEADER = ("cloud,instance,region,gpu_type,gpu_count,gpu_memory_gb,vcpus,memory_gb,"
          "on_demand_usd_per_hour,spot_usd_per_hour\n")
TODAY = date(2026, 1, 6)


def layer(folder, first_line: str, *rows: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "aws.csv").write_text(first_line + "\n" + HEADER + "".join(f"{r}\n" for r in rows))


def test_refreshed_rows_replace_shipped_ones_and_the_users_replace_both(tmp_path):
    refreshed, mine = tmp_path / "cache", tmp_path / "config"
    layer(refreshed, "# refreshed: 2026-01-05T10:00:00+00:00",
          "aws,ml.g5.xlarge,us-east-1,A10G,1,24,4,16,1.50,0.45",
          "aws,ml.m5.large,us-east-1,,0,,2,8,0.12,0.04",
          "aws,ml.g6.xlarge,us-east-1,L4,1,24,4,16,1.20,0.40")
    layer(mine, "# date: 2026-01-04", "aws,ml.m5.large,us-east-1,,0,,2,8,0.10,")
    catalog = load_catalog("aws", refreshed_dir=refreshed, override_dir=mine, today=TODAY, max_age_days=1000)
    rows = {(r.instance, r.region): r for r in catalog.rows}
    assert rows["ml.g5.xlarge", "us-east-1"].on_demand_micro_usd == 1_500_000  # refreshed over shipped
    assert rows["ml.g5.xlarge", "us-east-1"].date == date(2026, 1, 5)
    assert rows["ml.g5.xlarge", "us-west-2"].on_demand_micro_usd == 1_408_000  # shipped, not refreshed
    assert rows["ml.g6.xlarge", "us-east-1"].gpu_type == "L4"  # added by the refresh
    assert rows["ml.m5.large", "us-east-1"].on_demand_micro_usd == 100_000  # the user's wins over the refresh
    assert [s.path for s in catalog.sources][1:] == [str(refreshed / "aws.csv"), str(mine / "aws.csv")]
    assert [s.date for s in catalog.sources][1:] == [date(2026, 1, 5), date(2026, 1, 4)]


def test_without_a_refreshed_file_the_shipped_rows_stand(tmp_path):
    catalog = load_catalog("aws", refreshed_dir=tmp_path / "nothing", today=date(2025, 7, 2))
    assert len(catalog.sources) == 1 and len(catalog.rows) == len(load_catalog("aws", today=date(2025, 7, 2)).rows)


def test_a_bad_refreshed_timestamp_names_file_and_line(tmp_path):
    layer(tmp_path, "# refreshed: yesterday")
    with pytest.raises(FileError, match=r"aws.csv:1: refreshed: expected an ISO timestamp, got 'yesterday'"):
        load_catalog("aws", refreshed_dir=tmp_path, today=TODAY)
