"""Retries of backend calls, in one place: `TransientBackendError` is retried (or what the caller names), a
bounded number of times, with jittered exponential backoff (tenacity); anything else, or the last failure, is raised."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from trainmaster.backends.base import TransientBackendError

T = TypeVar("T")
ATTEMPTS = 4
MAX_WAIT_S = 5.0


async def retried(call: Callable[..., Awaitable[T]], *args, attempts: int = ATTEMPTS,
                  on: tuple[type[Exception], ...] = (TransientBackendError,), **kwargs) -> T:
    """`call(*args, **kwargs)`, tried again on the errors `on` (transient ones unless told otherwise)."""
    from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(on),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.2, max=MAX_WAIT_S),
        reraise=True,
    ):
        with attempt:
            return await call(*args, **kwargs)
    raise AssertionError("unreachable: tenacity either returns or raises")
