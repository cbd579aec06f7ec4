"""`cb-probe` / `python -m csbench.probe`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    # The carrier loop arrives with the wire protocol (issue 3); until then say so plainly.
    print("cb-probe: the carrier loop is not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
