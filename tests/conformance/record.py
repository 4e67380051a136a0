"""Record the conformance table from a broker (RabbitMQ), or check a broker against it.

    .venv/bin/python -m tests.conformance.record                  # RabbitMQ on 127.0.0.1:5672
    .venv/bin/python -m tests.conformance.record --only crossing/ # re-record some rows
    .venv/bin/python -m tests.conformance.record --check --port 5673   # compare a broker

Recording reads each step's answers until the broker has been quiet for the row's `quiet`
seconds, twice per row; a row whose two runs differ is reported and left out (a race in the
broker, not an answer). The table is written to tests/conformance/rabbitmq-<version>.json,
named after the version the broker reports in connection.start; test_conformance.py reads
the file named in TABLE below, so re-recording against a newer RabbitMQ means recording,
then pointing TABLE at the new file and reading the diff. Rows run in parallel threads (each
with its own connections; names are unique per row), so a whole recording takes about a
minute. Needs guest/guest on the broker, which RabbitMQ allows from loopback only."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pamqp import commands

from tests.conformance.cases import ROWS
from tests.conformance.wire import PROTOCOL_HEADER, Admin, Conn, Outcome, Row, differences, run

HERE = Path(__file__).resolve().parent
TABLE = HERE / "rabbitmq-3.10.8.json"


def load(path: Path = TABLE) -> dict[str, Outcome]:
    data = json.loads(path.read_text())
    return {name: Outcome.from_json(v) for name, v in data["rows"].items()}


def dump(broker: str, rows: dict[str, Outcome]) -> str:
    """JSON with one line per step, so a re-recording diffs row by row."""
    lines = ["{", f' "broker": {json.dumps(broker)},',
             ' "recorded_by": "python -m tests.conformance.record",', ' "rows": {']
    for i, (name, outcome) in enumerate(rows.items()):
        data = outcome.to_json()
        steps = ",\n".join(f"   {json.dumps(step)}" for step in data.pop("answers"))
        rest = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items())
        comma = "," if i < len(rows) - 1 else ""
        lines.append(f'  {json.dumps(name)}: {{"answers": [\n{steps}]{rest}}}{comma}')
    lines += [" }", "}", ""]
    return "\n".join(lines)


def broker_version(host: str, port: int) -> tuple[str, str]:
    conn = Conn(host, port)
    try:
        conn.send(PROTOCOL_HEADER)
        start = conn.expect(commands.Connection.Start)
    finally:
        conn.close()
    props = start.server_properties
    return str(props.get("product", "?")), str(props.get("version", "?"))


def _pool(host: str, port: int, rows: list[Row], job: Callable[[Row, Admin], object],
          workers: int) -> list[object]:
    local = threading.local()
    admins: list[Admin] = []
    lock = threading.Lock()

    def work(row: Row) -> object:
        if not hasattr(local, "admin"):
            local.admin = Admin(host, port)
            with lock:
                admins.append(local.admin)
        try:
            return job(row, local.admin)
        except Exception as exc:
            local.__dict__.pop("admin").close()  # its channel's state is unknown now
            raise RuntimeError(f"row {row.name}: {exc!r}") from exc

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(work, rows))
    finally:
        for admin in admins:
            admin.close()


def record(host: str, port: int, rows: list[Row], workers: int) -> tuple[dict[str, Outcome],
                                                                        list[str]]:
    def twice(row: Row, admin: Admin) -> tuple[Outcome, Outcome]:
        return run(row, host, port, admin), run(row, host, port, admin)

    results = _pool(host, port, rows, twice, workers)
    table: dict[str, Outcome] = {}
    unstable = []
    for row, (first, second) in zip(rows, results, strict=True):  # type: ignore[misc]
        if differences(first, second, got_may_reset=True):
            unstable.append(f"{row.name}: {first.to_json()} / {second.to_json()}")
        else:
            table[row.name] = first
    return table, unstable


def check(host: str, port: int, rows: list[Row], table: dict[str, Outcome],
          workers: int) -> list[str]:
    def one(row: Row, admin: Admin) -> list[str]:
        want = table[row.name]
        return differences(want, run(row, host, port, admin, expect=want))

    out = []
    for row, diffs in zip(rows, _pool(host, port, rows, one, workers), strict=True):
        for d in diffs:  # type: ignore[attr-defined]
            out.append(f"{row.name}: {d}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--only", default="", help="rows whose name contains this")
    parser.add_argument("--check", action="store_true",
                        help="compare the broker with the table instead of recording")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    rows = [r for r in ROWS if args.only in r.name]
    if args.check:
        diffs = check(args.host, args.port, rows, load(), args.workers)
        print("\n".join(diffs) or f"{len(rows)} rows: all answered as recorded")
        return 1 if diffs else 0
    product, version = broker_version(args.host, args.port)
    path = HERE / f"{product.lower()}-{version}.json"
    table, unstable = record(args.host, args.port, rows, args.workers)
    old = load(path) if path.exists() and args.only else {}
    old.update(table)
    order = [r.name for r in ROWS if r.name in old]
    path.write_text(dump(f"{product} {version}", {name: old[name] for name in order}))
    print(f"{len(table)} rows recorded from {product} {version} into {path.name}")
    for line in unstable:
        print("UNSTABLE (two runs differ, not recorded):", line, file=sys.stderr)
    return 1 if unstable else 0


if __name__ == "__main__":
    sys.exit(main())
