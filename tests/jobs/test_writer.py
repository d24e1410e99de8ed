"""The writer's reused state buffers: copies are the canonical bytes, and a buffer in use is never handed out."""

from __future__ import annotations

import pytest
import torch

from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.writer import StateBuffers


def _state(n: int, value: float) -> dict[str, torch.Tensor]:
    return {"b": torch.full((n,), value), "a": torch.arange(3)}


def test_a_copy_is_the_canonical_serialization():
    state = _state(10, 1.5)
    assert bytes(StateBuffers().copy(state)) == serialize(state)


def test_copies_in_use_never_share_a_buffer():
    buffers = StateBuffers()
    first = buffers.copy(_state(100, 1.0))
    second = buffers.copy(_state(100, 2.0))
    assert first.obj is not second.obj
    assert bytes(first) == serialize(_state(100, 1.0))  # not overwritten by the second copy


def test_a_buffer_given_back_is_reused_and_its_old_view_released():
    buffers = StateBuffers()
    first = buffers.copy(_state(100, 1.0))
    buffer = first.obj
    buffers.give_back(first)
    again = buffers.copy(_state(90, 3.0))
    assert again.obj is buffer and bytes(again) == serialize(_state(90, 3.0))
    with pytest.raises(ValueError, match="released"):  # nobody reads bytes that now belong to another state
        bytes(first)


def test_a_grown_state_gets_a_larger_buffer_and_the_small_one_is_dropped():
    buffers = StateBuffers()
    small = buffers.copy(_state(100, 1.0))
    buffers.give_back(small)
    grown = _state(10_000, 2.0)
    copy = buffers.copy(grown)
    large = copy.obj
    assert len(large) >= len(serialize(grown)) and bytes(copy) == serialize(grown)
    buffers.give_back(copy)
    assert buffers.copy(_state(100, 1.0)).obj is large  # only the large one was kept


@pytest.mark.parametrize("kind", ["host", "pinned"])
def test_idle_buffers_of_several_sizes_are_taken_by_identity(kind):
    """A growing state (DQN's replay buffer, PPO's rollout) leaves idle buffers of several sizes. Taking one that is
    not first in the pool once compared the buffers with ``==`` (``list.remove``): elementwise on the pinned tensors,
    which failed with "The size of tensor a (46886) must match the size of tensor b (55776)" and ended every DQN and
    PPO run on an H200 at its third boundary; byte for byte on the host's bytearrays."""
    from trainmaster.jobs.host_copy import PinnedBuffers

    if kind == "host":
        pool = StateBuffers()
        small, large = pool._take(100), pool._take(300)
        pool.give_back(memoryview(small)[:100]), pool.give_back(memoryview(large)[:300])
        assert pool._take(200) is large and pool._idle == [small]
        assert pool._take(1000) is not small and pool._idle == []  # all too small: the largest idle one went
    else:
        pool = PinnedBuffers()
        (small, a), (large, b) = pool.take(100), pool.take(300)
        pool.give_back(a), pool.give_back(b)
        taken, _ = pool.take(200)
        assert taken is large and len(pool._idle) == 1 and pool._idle[0] is small
        pool.take(1000)
        assert pool._idle == []
