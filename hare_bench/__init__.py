"""Hare's own benchmarks, beside the load generator (hare_perf) and outside the broker package:
micro-benchmarks of the broker's parts in one process, and benchmarks of whole Hare nodes.

bench_routing.py   topic-routing micro-benchmark (10 vs 10,000 bindings)
bench_queue.py     the queue's enqueue/deliver/ack cost, plain and per delivery feature
bench_store.py     msg_store write/read/remove micro-benchmark
bench_reader.py    the publish path from bytes to queue in one process, no socket
bench_pubsub.py    a publisher and a fast consumer on a loop without I/O
bench_recovery.py  start-up time and peak RSS after kill -9 with N persistent messages
bench_store_reader.py  rows/s of spark.read.format("hare-store") over a stopped broker's directory
bench_spark.py     the Spark connector beside plain pika clients (`make bench-spark`)
bench_cluster.py   two nodes against one under hare-perf's workers
bench_quorum.py    a quorum queue of three members beside a classic durable queue
local_cluster.py   etcd and N Hare nodes on this machine (`make cluster`, bench_cluster)
"""
