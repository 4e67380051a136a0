"""hare-perf: a load generator for any AMQP 0-9-1 broker (RabbitMQ PerfTest in spirit).

A tool beside the broker, not part of it: nothing here imports `broker` (tests/test_layering.py
holds that), so it measures RabbitMQ and Hare alike.

scanner.py  frame scanner for the consumer side (bytes in, counters out)
wire.py     URL parsing, pamqp slow path, pre-encoded publish batches
client.py   the raw asyncio client: handshake, RPC, back-pressure, connection.blocked
workers.py  publisher / consumer / idle-connection processes
crew.py     worker orchestration: the crew of worker processes, the control connection
host.py     host measurement: RSS, CPU time, what other processes use
scenarios.py the scenario table and the scenarios
report.py   text and JSON output
cli.py      `hare-perf SCENARIO --url URL ...`
suite.py    `python -m hare_perf.suite --url URL [--url URL2]` (all scenarios, side by side;
            `make bench`)
baselines/  a recorded run of the suite against RabbitMQ 3.10.8 (docs/BENCHMARKS.md)
"""
