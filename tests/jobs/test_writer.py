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
