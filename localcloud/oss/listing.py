"""The ListObjects walk over a sorted key list: prefix, delimiter, "start after" and a page size.

Pure function, shared by v1 (marker) and v2 (continuation-token / start-after). Cost is O(log n + page size)
thanks to bisect, plus one bisect per common prefix to jump over everything it rolls up.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class Page:
    keys: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    truncated: bool = False
    last: str = ""  # the last key or common prefix returned: the next page starts after it

    @property
    def count(self) -> int:
        return len(self.keys) + len(self.prefixes)


def _successor(prefix: str) -> str:
    """The smallest string greater than every string starting with `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def list_page(keys: list[str], prefix: str, delimiter: str, after: str, max_keys: int) -> Page:
    """Keys and common prefixes, in order, strictly greater than `after`, at most `max_keys` of them together.

    A common prefix that is <= `after` was fully returned on an earlier page, so it is skipped — this is what
    lets a NextMarker that is a common prefix resume correctly.
    """
    page = Page()
    i = bisect.bisect_left(keys, prefix)
    if after:
        i = max(i, bisect.bisect_right(keys, after))
    while i < len(keys):
        key = keys[i]
        if not key.startswith(prefix):
            break
        common = None
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                common = key[: cut + len(delimiter)]
        if common is not None and common <= after:
            i = bisect.bisect_left(keys, _successor(common), i)
            continue
        if page.count >= max_keys:
            page.truncated = True
            break
        if common is not None:
            page.prefixes.append(common)
            page.last = common
            i = bisect.bisect_left(keys, _successor(common), i)
        else:
            page.keys.append(key)
            page.last = key
            i += 1
    return page
