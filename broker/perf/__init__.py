"""hare-perf: a load generator for any AMQP 0-9-1 broker (RabbitMQ PerfTest in spirit).

scanner.py  frame scanner for the consumer side (bytes in, counters out)
wire.py     URL parsing, pamqp slow path, pre-encoded publish batches
client.py   the raw asyncio client: handshake, RPC, back-pressure, connection.blocked
workers.py  publisher / consumer / idle-connection processes
scenarios.py the scenarios and their orchestration
report.py   text and JSON output
cli.py      `hare-perf SCENARIO --url URL ...`
suite.py    `python -m broker.perf.suite --url URL [--url URL2]` (all scenarios, side by side)
bench_routing.py   topic-routing micro-benchmark (10 vs 10,000 bindings)
bench_queue.py     the queue's enqueue/deliver/ack cost, plain and per delivery feature
bench_store.py     msg_store write/read/remove micro-benchmark
bench_recovery.py  start-up time and peak RSS after kill -9 with N persistent messages
bench_store_reader.py  rows/s of spark.read.format("hare-store") over a stopped broker's directory
"""
