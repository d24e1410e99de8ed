"""Reading price answers: a typed error naming the field that does not parse, and dollars to micro-USD."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from trainmaster.backends.base import BackendError
from trainmaster.jobs.money import MICRO_PER_USD


class PriceParseError(BackendError):
    """A price API answered something that does not parse; the message names the field."""


def dig(obj, path: str, *, api: str, where: str = ""):
    """`obj[a][b]...` for `path` "a.b...", or PriceParseError naming `where` + the missing field."""
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            raise PriceParseError(f"{api}: {where}{path}: missing")
        obj = obj[key]
    return obj


def micro_usd(value, *, api: str, field: str) -> int:
    """A dollar amount (number or decimal string, any precision) as micro-USD, rounded half-even."""
    if isinstance(value, bool):
        raise PriceParseError(f"{api}: {field}: expected a price, got {value!r}")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise PriceParseError(f"{api}: {field}: expected a price, got {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise PriceParseError(f"{api}: {field}: expected a price, got {value!r}")
    return int((amount * MICRO_PER_USD).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def nanos_to_micro(nanos: Decimal) -> int:
    """Billionths of a dollar (exact) to micro-USD, rounded half-even once, at the end."""
    return int((nanos / 1000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
