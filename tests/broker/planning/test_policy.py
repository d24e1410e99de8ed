"""Cost policies: the shipped files, the tier syntax, and errors that name file, line and field."""

from __future__ import annotations

import textwrap

import pytest

from trainmaster.broker.planning.policy import Step, load_policy, parse_step, shipped, tier_name
from trainmaster.jobs.yamlfile import FileError


def write(tmp_path, body: str, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def problems_of(path) -> list[str]:
    with pytest.raises(FileError) as err:
        load_policy(path)
    return err.value.problems


def test_shipped_policies_all_load():
    assert {"default", "hybrid", "privacy-first", "cloud-only"} <= set(shipped())
    for name in shipped():
        assert load_policy(name).name == name


def test_hybrid_routes_each_class_as_the_issue_says():
    hybrid = load_policy("hybrid")
    tiers = {w: [tier_name(t) for t in hybrid.for_class(w).tiers]
             for w in ("development", "initial_training", "online_learning", "retraining")}
    assert tiers == {
        "development": ["local"],
        "initial_training": ["bittensor", "aws:spot"],
        "online_learning": ["local"],
        "retraining": ["bittensor", "gcp:spot"],
    }
    assert hybrid.for_class("retraining").objective == "cheapest-by-deadline"
    assert {b.label for b in hybrid.budgets} >= {"all spend per month", "bittensor per month"}


def test_privacy_first_and_cloud_only():
    private = load_policy("privacy-first")
    assert private.local_only
    assert all(load_policy("privacy-first").for_class(w).chain == ["local"] for w in ("development", "retraining"))
    cloud = load_policy("cloud-only")
    for workload in ("development", "initial_training", "online_learning", "retraining"):
        assert set(cloud.for_class(workload).chain) == {"aws", "gcp", "azure"}
    assert [tier_name(t) for t in cloud.for_class("initial_training").tiers] == [
        "{aws:spot, gcp:spot, azure:spot}", "{aws:on-demand, gcp:on-demand, azure:on-demand}",
    ]


def test_default_policy_is_local_only_for_every_class():
    policy = load_policy()
    assert policy.name == "default"
    assert policy.for_class("initial_training").chain == ["local"]
    assert policy.budgets == []


def test_for_class_falls_back_to_default(tmp_path):
    path = write(tmp_path, """
        name: t
        default: {primary: local}
        classes:
          retraining: {primary: aws, fallbacks: [gcp:spot, [azure, local]]}
    """)
    policy = load_policy(path)
    assert policy.for_class("development").chain == ["local"]
    retraining = policy.for_class("retraining")
    assert retraining.chain == ["aws", "gcp", "azure", "local"]
    assert retraining.tiers == [(Step("aws"),), (Step("gcp", "spot"),), (Step("azure"), Step("local"))]


def test_step_parsing():
    assert parse_step("aws:on-demand") == Step("aws", "on-demand")
    assert not Step("aws", "spot").admits_spot(False) and Step("aws").admits_spot(True)
    with pytest.raises(ValueError, match="did you mean 'bittensor'"):
        parse_step("bittensr")
    with pytest.raises(ValueError, match="spot or on-demand"):
        parse_step("aws:preemptible")
    with pytest.raises(ValueError, match="local has no spot"):
        parse_step("local:spot")


def test_unknown_field_names_file_line_and_suggests(tmp_path):
    path = write(tmp_path, """
        name: t
        classes:
          development:
            objectve: cheapest
            primary: local
    """)
    assert problems_of(path) == [f"{path}:4: classes.development.objectve: unknown field; did you mean 'objective'?"]


def test_bad_values_point_at_their_lines(tmp_path):
    path = write(tmp_path, """
        name: t
        default:
          objective: cheapest
          primary: bittensr
          constraints:
            max_usd_per_hour: lots
        budgets:
          - cap: 10
            period: fortnight
    """)
    found = "\n".join(problems_of(path))
    assert f"{path}:4: default.primary.0: Value error, unknown backend 'bittensr'; did you mean 'bittensor'?" in found
    assert f"{path}:6: default.constraints.max_usd_per_hour: " in found
    assert f"{path}:9: budgets.0.period: " in found


def test_unknown_workload_class_is_an_error(tmp_path):
    path = write(tmp_path, """
        name: t
        classes:
          pretraining: {primary: local}
    """)
    [problem] = problems_of(path)
    assert problem.startswith(f"{path}:3: classes.pretraining")


@pytest.mark.parametrize("body, message", [
    ("default: {primary: aws, constraints: {allowed_backends: [gcp]}}", "'aws' is not in constraints.allowed_backends"),
    ("default: {primary: aws, constraints: {local_only: true}}", "'aws' leaves this machine"),
    ("default: {primary: 'aws:spot', constraints: {spot_allowed: false}}", "asks for spot"),
    ("default: {primary: local, constraints: {regions: [us-*]}}", "excludes 'local'"),
    ("default: {primary: aws, fallbacks: [aws]}", "appears twice"),
    ("default: {primary: [], fallbacks: [aws]}", "empty list"),
    ("default: {primary: aws, constraints: {allowed_backends: ['aws:spot']}}", "name a backend only"),
    ("local_only: true\ndefault: {primary: local}\nclasses:\n  retraining: {primary: gcp}", ":5: classes.retraining: "),
    ("budgets: [{cap: 1, name: a}, {cap: 2, name: a}]", "two budgets are named 'a'"),
    ("budgets: [{cap: 1, webhook: 'ftp://x'}]", "http:// or https://"),
    ("budgets: [{cap: 1, alert_at_percent: [0]}]", "between 1 and 1000"),
])
def test_inconsistent_policies_are_refused_with_the_reason(tmp_path, body, message):
    path = write(tmp_path, "name: t\n" + body + "\n")
    found = "\n".join(problems_of(path))
    assert message in found
    assert found.startswith(f"{path}:")


def test_duplicate_key_and_empty_file(tmp_path):
    dup = write(tmp_path, "name: a\nname: b\n", "dup.yaml")
    assert problems_of(dup) == [f"{dup}:2: name: duplicate key (first on line 1)"]
    empty = write(tmp_path, "", "empty.yaml")
    assert problems_of(empty) == [f"{empty}:1: the file is empty"]


def test_user_policy_by_name_shadows_nothing_shipped_but_is_found(tm_home):
    user_dir = tm_home / "config" / "policies"
    user_dir.mkdir(parents=True)
    (user_dir / "mine.yaml").write_text("name: mine\ndefault: {primary: gcp}\n")
    assert load_policy("mine").for_class("development").chain == ["gcp"]
    with pytest.raises(FileError, match="no policy named 'nope'"):
        load_policy("nope")


def test_budget_amounts_are_integer_micro_usd(tmp_path):
    path = write(tmp_path, """
        name: t
        budgets:
          - {cap: 12.34, backend: aws, period: week, alert_at_percent: [100, 50]}
    """)
    [budget] = load_policy(path).budgets
    assert budget.cap == 12_340_000
    assert budget.alert_at_percent == [50, 100]
    assert budget.label == "week: backend=aws"
