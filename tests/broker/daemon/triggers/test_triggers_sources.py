"""Data thresholds against real servers: an S3 prefix listed through the S3 store on moto, and a Redis stream on
a real `redis-server` filled with XADD, each firing once per threshold of new data since the last accepted run."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from clouds.aws_server import BUCKET
from trainmaster.broker.daemon.triggers.engine import TriggerEngine
from trainmaster.broker.daemon.triggers.model import Data
from trainmaster.broker.daemon.triggers.sources import observe
from trigger_support import Jobs, trigger

pytest_plugins = ["clouds.conftest_aws", "redis_server"]

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()


def tick(eng, now=NOW):
    return asyncio.run(eng.tick(now))


def test_an_s3_prefix_fires_at_its_threshold_of_new_objects(aws, aws_config, tmp_path):
    s3 = aws.client("s3")
    for i in range(3):
        s3.put_object(Bucket=BUCKET, Key=f"incoming/batch-{i}.parquet", Body=b"x")
    s3.put_object(Bucket=BUCKET, Key="elsewhere/not-counted", Body=b"x")
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(prefix=f"s3://{BUCKET}/incoming", min_new=4))],
                        jobs.submit, configs={"aws": aws_config})
    assert tick(eng) == []
    s3.put_object(Bucket=BUCKET, Key="incoming/sub/batch-3.parquet", Body=b"x")
    [fired] = tick(eng, NOW + 10)
    assert "data: 4 new" in fired.reason
    jobs.end(fired.job_id)
    s3.put_object(Bucket=BUCKET, Key="incoming/batch-4.parquet", Body=b"x")
    assert tick(eng, NOW + 20) == []  # one new since the accepted run
    assert jobs.store.events(fired.job_id)[0].detail["origin"]["trigger_key"] == fired.key


def test_an_unreachable_prefix_is_a_problem_not_a_crash(aws, aws_config, tmp_path):
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(prefix="s3://no-such-bucket/x", min_new=1))],
                        jobs.submit, configs={"aws": aws_config})
    assert tick(eng) == [] and "cannot list s3://no-such-bucket/x" in eng.problems["t"]


@pytest.fixture
def stream(redis_url, request):
    import redis

    client = redis.Redis.from_url(redis_url)
    key = f"experiences-{request.node.name}"
    client.delete(key)
    yield client, key
    client.delete(key)
    client.close()


def add(client, key, n):
    for i in range(n):
        client.xadd(key, {"obs": str(i), "reward": "1.0"})


def test_a_redis_stream_fires_once_per_n_new_entries(redis_url, stream, tmp_path):
    client, key = stream
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(redis=redis_url, stream=key, min_new=100))],
                        jobs.submit)
    assert tick(eng) == []  # the stream does not exist yet
    add(client, key, 99)
    assert tick(eng, NOW + 1) == []
    add(client, key, 1)
    [first] = tick(eng, NOW + 2)
    assert "data: 100 new" in first.reason
    add(client, key, 150)
    assert tick(eng, NOW + 3) == []  # its run has not ended
    jobs.end(first.job_id)
    [second] = tick(eng, NOW + 4)  # 150 arrived after the first fire's cursor
    jobs.end(second.job_id)
    assert tick(eng, NOW + 5) == []
    add(client, key, 99)
    assert tick(eng, NOW + 6) == []
    add(client, key, 1)
    assert len(tick(eng, NOW + 7)) == 1 and len(jobs.all()) == 3


def test_a_failed_run_counts_its_stream_entries_again(redis_url, stream, tmp_path):
    client, key = stream
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(redis=redis_url, stream=key, min_new=10))],
                        jobs.submit)
    add(client, key, 10)
    [first] = tick(eng)
    jobs.end(first.job_id, "failed")
    [again] = tick(eng, NOW + 1)
    assert "data: 10 new" in again.reason


def test_a_stream_is_counted_only_up_to_its_threshold(redis_url, stream):
    client, key = stream
    add(client, key, 500)
    seen = asyncio.run(observe(Data(redis=redis_url, stream=key, min_new=50), None, {}))
    newest = client.xrevrange(key, count=1)[0][0].decode()
    assert seen.new == 50 and seen.cursor == {"last_id": newest}
    assert asyncio.run(observe(Data(redis=redis_url, stream=key, min_new=50), seen.cursor, {})).new == 0


def test_a_redis_server_that_is_down_is_a_problem(tmp_path):
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db",
                        [trigger(data=Data(redis="redis://:secret@127.0.0.1:1/0", stream="s", min_new=1))], jobs.submit)
    assert tick(eng) == []
    assert "cannot read stream 's' at redis://127.0.0.1:1/0" in eng.problems["t"] and "secret" not in eng.problems["t"]
