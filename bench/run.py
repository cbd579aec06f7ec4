"""`make bench`: print one line per figure, `BENCH <name> <value> <unit>`, and write bench/results.json.

Each bench is a function returning figures; they run one after another on the same machine so that
any ratio between peers is measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benches import BENCHES, Figure  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"subset of: {', '.join(BENCHES)}")
    args = parser.parse_args(argv)
    selected: dict[str, Callable[[], list[Figure]]] = (
        {n: BENCHES[n] for n in args.names} if args.names else dict(BENCHES))
    figures: list[Figure] = []
    failed: list[str] = []
    for name, bench in selected.items():
        print(f"# {name} ...", file=sys.stderr, flush=True)
        try:
            for fig in bench():
                print(f"BENCH {fig.name} {fig.value:.6g} {fig.unit}", flush=True)
                figures.append(fig)
        except Exception as exc:  # one broken bench must not hide the others' figures
            print(f"# {name} FAILED: {exc!r}", file=sys.stderr, flush=True)
            failed.append(name)
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "figures": {f.name: {"value": f.value, "unit": f.unit, **({"note": f.note} if f.note else {})}
                    for f in figures},
        "failed": failed,
    }
    (HERE / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
