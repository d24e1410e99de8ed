"""Money as integers: micro-USD (1 USD = 1,000,000) and rao (1 TAO = 1,000,000,000). Never floats.

Users write dollars in YAML (`max_usd: 12.50`); they are parsed exactly through `Decimal`, so
`0.1` is 100,000 micro-USD and not 99,999.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

MICRO_PER_USD = 1_000_000
RAO_PER_TAO = 1_000_000_000


def parse_usd(value: object) -> int:
    """Dollars (number or string such as "12.5" or "$12.50") to integer micro-USD."""
    if isinstance(value, bool):
        raise ValueError("expected an amount in USD, got a boolean")
    if isinstance(value, int):
        return value * MICRO_PER_USD
    text = str(value).strip().lstrip("$").replace("_", "")
    try:
        amount = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"expected an amount in USD such as 12.50, got {value!r}") from None
    if not amount.is_finite():
        raise ValueError(f"expected a finite amount in USD, got {value!r}")
    micro = (amount * MICRO_PER_USD).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    if micro != amount * MICRO_PER_USD:
        raise ValueError(f"{value!r} has more precision than a micro-dollar")
    return int(micro)


def format_usd(micro: int) -> str:
    """Integer micro-USD as a plain decimal string without trailing zeros ("12.5", "0.000001")."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO_PER_USD)
    return f"{sign}{whole}" + (f".{frac:06d}".rstrip("0") if frac else "")


def display_usd(micro: int) -> str:
    """For people: `$12.50`, or more digits when the amount is below a cent."""
    if micro != 0 and abs(micro) < 10_000:
        return f"${format_usd(micro)}"
    sign = "-" if micro < 0 else ""
    cents = (abs(micro) + 5_000) // 10_000
    return f"{sign}${cents // 100:,}.{cents % 100:02d}"
