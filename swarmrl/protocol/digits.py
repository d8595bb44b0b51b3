"""Whole numbers read from text a client controls (headers, queries, JSON keys).

`str.isdigit()` and `int()` accept far more than 0-9: superscripts ("²"),
other scripts' digits ("١٢"), surrounding whitespace, underscores ("1_0"). The
first makes `int()` raise after `isdigit()` said yes; the others let two
different strings name the same number. Everything a peer sends is read here:
ASCII digits only, bounded length, or None.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]{1,18}")


def ascii_int(text: object, max_digits: int = 18) -> int | None:
    """The value of `text` if it is 1 to `max_digits` ASCII digits, else None."""
    if not isinstance(text, str) or len(text) > max_digits or not _DIGITS.fullmatch(text):
        return None
    return int(text)
