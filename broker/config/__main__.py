"""`python -m broker.config [flags]`: check a configuration without starting the broker.

Prints the effective settings as JSON (passwords left out) and exits 0, or prints the one-line
problem and exits 2, exactly as hare-server would refuse to start.
"""

from __future__ import annotations

import json
import sys

from broker.config.loader import ConfigError, load_settings


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings(argv)
    except ConfigError as exc:
        print(f"hare: configuration error: {exc}", file=sys.stderr)
        return 2
    json.dump(settings.redacted(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
