"""Hare: an AMQP 0-9-1 message broker shaped like RabbitMQ."""

import os as _os
import warnings as _warnings

from broker import compiled as _compiled

__version__ = "0.1.0"

# Before any compiled module is imported (broker/compiled.py): the sources when asked, or
# when a build is older than its source; never a mix of old and new code.
if _os.environ.get("HARE_PURE_PYTHON"):
    _compiled.prefer_source()
elif _stale := _compiled.stale():
    _warnings.warn(
        f"compiled modules older than their source ({', '.join(_stale)}): running the .py "
        "files; `make compile` rebuilds them",
        stacklevel=1,
    )
    _compiled.prefer_source()
