"""The "hare-store" data source: a stopped (or copied) Hare data directory read offline, one row
per message a durable queue still holds, exactly what the broker would serve after a restart.

    spark.read.format("hare-store").load("/var/lib/hare")

Planning (driver) refuses a directory whose lock a running broker holds (unless
``allowLive=true``), maps ``queues/<hash>/`` back to vhost and queue through a copy of the
definitions database, reads the persistent message store's locations (`read_store`: the
snapshot after a clean stop, else a scan) and makes one partition per queue index segment,
carrying where the store bodies of that segment's entries are. Reading (executors) replays the
segment and yields Arrow batches: embedded bodies come from the index record, the others from
one pread of their store record, each checked against its CRC. All parsing is broker.store's
(one parser per format); nothing here writes to the directory. Damage is a row whose
`_damaged` column says what and where (file, offset), Spark's `_corrupt_record` convention,
and a warning in the executor's log. See docs/SPARK.md."""

from __future__ import annotations

import logging
import os
import tempfile
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.message import Message
from broker.spark.columns import header_strings
from broker.spark.options import StoreOptions
from broker.store import layout
from broker.store.definitions import Definitions, DefinitionsCorrupt
from broker.store.msg_store_files import Damage, StoreView, read_store
from broker.store.queue_index_files import (
    existing_segment_entries,
    index_dirs,
    read_index_segment,
    segment_files,
)
from broker.store.segment import CorruptRecord, decode_record
from broker.store.stream_format import (
    SegmentDamage,
    chunk_records,
    list_segments,
    segment_path,
    walk_segment,
)

__all__ = ["STORE_SCHEMA", "HareStoreDataSource", "HareStoreError"]

log = logging.getLogger("hare.spark.store")

_S, _L = StringType(), LongType()
STORE_SCHEMA = StructType([
    StructField("vhost", _S), StructField("queue", _S), StructField("seq_id", _L),
    StructField("msg_id", _S),  # 128 bits as 32 hex digits
    StructField("persistent", BooleanType()), StructField("redelivered", BooleanType()),
    StructField("exchange", _S), StructField("routing_key", _S),
    StructField("content_type", _S), StructField("content_encoding", _S),
    StructField("headers", MapType(_S, _S, True)),
    StructField("delivery_mode", IntegerType()), StructField("priority", IntegerType()),
    StructField("correlation_id", _S), StructField("reply_to", _S),
    StructField("expiration", _S), StructField("message_id", _S),
    StructField("timestamp", TimestampType()), StructField("type", _S),
    StructField("user_id", _S), StructField("app_id", _S),
    StructField("body", BinaryType()), StructField("size", _L),
    StructField("file", _S),  # where the body is: a store segment, or the index segment
    StructField("offset", _L),
    # a stream's messages: their offset in the stream and when their chunk was appended
    StructField("stream_offset", _L), StructField("stream_time", TimestampType()),
    StructField("_damaged", _S),  # null on message rows; what is wrong on damage rows
])
_ARROW = to_arrow_schema(STORE_SCHEMA, timezone="UTC")
_NAMES = STORE_SCHEMA.fieldNames()
_BODY = _NAMES.index("body")
_FILE = _NAMES.index("file")
_PROPS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
          "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
          "message_type", "user_id", "app_id")  # pamqp's names, in column order
_BATCH_ROWS = 4096
_BATCH_BYTES = 32 << 20  # bodies per Arrow batch: a batch of 10 MB messages stays bounded


class HareStoreError(ValueError):
    """The directory cannot be read as asked (live broker, not a Hare directory)."""


class HareStoreDataSource(DataSource):
    """spark.read.format("hare-store").option("allowLive", "false").load(DATA_DIR)"""

    @classmethod
    def name(cls) -> str:
        return "hare-store"

    def schema(self) -> StructType:
        return STORE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _StoreReader(self.options)


class _StoreReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        opts = StoreOptions.parse(options)
        self.data_dir = Path(opts.data_dir)
        self.allow_live = opts.allow_live

    def partitions(self) -> list[InputPartition]:
        return plan(self.data_dir, self.allow_live)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, _DamagePartition):
            rows = _Rows()
            for d in partition.damage:
                rows.damage(d.what, d.file, d.offset, d.length)
            yield from rows.flush()
            return
        if isinstance(partition, _SegmentPartition):
            yield from _read_segment(self.data_dir, partition)
        elif isinstance(partition, _StreamPartition):
            yield from _read_stream_segment(self.data_dir, partition)
        # else: no partitions planned, and Spark reads one empty partition of its own


# -- planning (driver) ---------------------------------------------------------------------------
@dataclass(slots=True)
class _SegmentPartition(InputPartition):
    """One queue index segment and the store locations of its entries' bodies."""

    vhost: str
    queue: str
    segment: str  # path relative to the data directory
    number: int
    segment_entries: int
    store_dir: str  # relative to the data directory
    refs: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # msg_id -> _Where


@dataclass(slots=True)
class _StreamPartition(InputPartition):
    """One segment of a stream's log."""

    vhost: str
    queue: str
    directory: str  # the stream's, relative to the data directory
    first: int  # the segment's first offset


@dataclass(slots=True)
class _DamagePartition(InputPartition):
    """Damage found while planning (message store files), reported as rows."""

    damage: list[Damage]


def plan(data_dir: Path, allow_live: bool) -> list[InputPartition]:
    """The partitions of a read of `data_dir` (see the module docstring): a single node's
    directory, or each worker's of a multi-worker server's (`w<i>/`, paths then start so)."""
    if not data_dir.is_dir():
        raise HareStoreError(f"hare-store: {data_dir} is not a directory")
    nodes = layout.node_dirs(data_dir)
    marks = (layout.DEFINITIONS, layout.QUEUES, layout.MSG_STORE_PERSISTENT, layout.STREAMS)
    if not any((d / m).exists() for d in nodes for m in marks):
        raise HareStoreError(f"hare-store: {data_dir} is not a Hare data directory "
                             f"(none of {', '.join(marks)} in it)")
    for d in dict.fromkeys([data_dir, *nodes]):  # a tree's parent holds the top's lock
        holder = layout.lock_holder(d)
        if holder is not None and not allow_live:
            raise HareStoreError(
                f"hare-store: {data_dir} belongs to a running broker (pid {holder} holds "
                f"{layout.LOCK_FILE}); stop it, read a copy, or set allowLive=true to read "
                "the files as they are (no consistent snapshot)")
    parts: list[InputPartition] = []
    damage: list[Damage] = []
    for node_dir in nodes:
        parts += _plan_node(data_dir, node_dir, damage)
    if damage:
        parts.append(_DamagePartition(damage))
    return parts


def _plan_node(data_dir: Path, node_dir: Path, damage: list[Damage]) -> list[InputPartition]:
    """One node directory's partitions, paths relative to `data_dir`; its store's damage
    onto `damage`."""
    names = _queue_names(node_dir)
    store_dir = node_dir / layout.MSG_STORE_PERSISTENT
    store = read_store(store_dir) if store_dir.is_dir() else StoreView(clean=False)
    store_rel = str(store_dir.relative_to(data_dir))
    for d in store.damage:
        d.file = f"{store_rel}/{d.file}"
        log.warning("hare-store: %s damaged at offset %d (%d bytes): %s", d.file, d.offset,
                    d.length, d.what)
    parts: list[InputPartition] = []
    owned, orphans = [], 0
    for qdir in index_dirs(node_dir / layout.QUEUES):
        owner = names.get(qdir.name) if qdir.parent == node_dir / layout.QUEUES else None
        if owner is None:
            orphans += 1  # deleted during a crash: the next start removes it
            continue
        owned.append((owner, qdir))
    for (vhost, queue), qdir in sorted(owned):
        entries = existing_segment_entries(qdir, None)
        for number, path in segment_files(qdir):
            part = _SegmentPartition(vhost, queue, str(path.relative_to(data_dir)), number,
                                     entries, store_rel)
            if store.locations:
                part.refs = _refs(path, number, entries, store)
            parts.append(part)
    streams_root = node_dir / layout.STREAMS
    streams = sorted((names[d.name], d) for d in (
        streams_root.iterdir() if streams_root.is_dir() else ()) if d.name in names)
    for (vhost, queue), sdir in streams:
        rel = str(sdir.relative_to(data_dir))
        parts.extend(_StreamPartition(vhost, queue, rel, first) for first in list_segments(sdir))
    if orphans:
        log.warning("hare-store: %d queue index director(y/ies) no durable queue owns "
                    "skipped (a restart deletes them)", orphans)
    damage += store.damage
    return parts


def _queue_names(data_dir: Path) -> dict[str, tuple[str, str]]:
    """queues/<hash> directory name -> (vhost, queue), from a copy of the definitions
    database (reading it in place would write its -shm file)."""
    db_path = data_dir / layout.DEFINITIONS
    if not db_path.is_file():
        log.warning("hare-store: %s has no %s: no queue is known, nothing to read", data_dir,
                    layout.DEFINITIONS)
        return {}
    with tempfile.TemporaryDirectory(prefix="hare-store-") as tmp:
        try:
            db = Definitions.copy_of(db_path, Path(tmp))
        except DefinitionsCorrupt as e:
            raise HareStoreError(f"hare-store: the definitions database is damaged: {e}") from e
        try:
            return {layout.queue_dir_name(q.vhost, q.name): (q.vhost, q.name)
                    for q in db.queues() if q.durable}
        finally:
            db.close()


_Where = tuple[str, int, int]  # store file name, record offset, record size


def _refs(path: Path, number: int, entries: int, store: StoreView) -> dict[int, _Where]:
    """Where the store bodies of a segment's live entries are (those the store has)."""
    scan = read_index_segment(path, number, entries).scan
    if scan is None:
        return {}
    where = store.locations
    return {msg_id: where[msg_id] for msg_id, payload in scan.entries.values()
            if payload is None and msg_id in where}


# -- reading (executors) -------------------------------------------------------------------------
def _read_segment(data_dir: Path, part: _SegmentPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one index segment, as recovery would keep its entries."""
    rows = _Rows(part.vhost, part.queue)
    path = data_dir / part.segment
    seg = read_index_segment(path, part.number, part.segment_entries)
    scan = seg.scan
    if scan is None:
        rows.damage(f"{seg.fault}: {seg.detail}", part.segment, 0, seg.size)
        yield from rows.flush()
        return
    for offset, length in scan.corrupt:
        rows.damage("corrupt record", part.segment, offset, length)
    if scan.torn_bytes:
        rows.damage("torn tail", part.segment, scan.good_end, scan.torn_bytes)
    base = part.number * part.segment_entries
    missing = 0
    files: dict[str, int] = {}
    try:
        for rel in sorted(scan.entries):
            msg_id, payload = scan.entries[rel]
            seq_id, delivered = base + rel, rel in scan.delivered
            if payload is not None:
                rows.message(seq_id, msg_id, delivered, payload, part.segment,
                             scan.positions[rel])
            else:
                where = part.refs.get(msg_id)
                if where is None:  # a transient message's page-out, or lost: not served
                    missing += 1
                    continue
                name, offset, size = where
                rel_name = f"{part.store_dir}/{name}"
                try:
                    data = _pread(files, data_dir, rel_name, size, offset)
                    body = decode_record(data, msg_id)
                except (OSError, CorruptRecord) as e:
                    rows.damage(f"store record unreadable: {e}", rel_name, offset, size,
                                seq_id, msg_id)
                    continue
                rows.message(seq_id, msg_id, delivered, body, rel_name, offset)
            if rows.full():
                yield from rows.flush()
    finally:
        for fd in files.values():
            os.close(fd)
    yield from rows.flush()
    if rows.damaged or missing:
        log.warning("hare-store: %s (%s/%s): %d damaged, %d entr(y/ies) with no body in the "
                    "persistent store skipped", part.segment, part.vhost, part.queue,
                    rows.damaged, missing)


def _read_stream_segment(data_dir: Path, part: _StreamPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one stream segment: every chunk that checks out, as the stream's recovery
    keeps them; a damaged chunk or a torn tail is a damage row (stream_format.walk_segment)."""
    rows = _Rows(part.vhost, part.queue)
    directory = data_dir / part.directory
    rel = f"{part.directory}/{segment_path(directory, part.first).name}"
    for got in walk_segment(directory, part.first):
        if isinstance(got, SegmentDamage):
            rows.damage(got.what, rel, got.position, got.length)
            continue
        info, payload = got
        stamp = info.timestamp * 1000  # ms -> Spark's microseconds
        for i, (a, b) in enumerate(chunk_records(payload)):
            rows.message(info.offset + i, None, False, payload[a:b], rel, info.position,
                         stream=(info.offset + i, stamp))
            if rows.full():
                yield from rows.flush()
    yield from rows.flush()


def _pread(files: dict[str, int], data_dir: Path, name: str, size: int, offset: int) -> bytes:
    fd = files.get(name)
    if fd is None:
        fd = files[name] = os.open(data_dir / name, os.O_RDONLY)
    return os.pread(fd, size, offset)


def _binary(values: tuple[bytes | None, ...]) -> pa.Array:
    """A binary column built from one joined buffer: pa.array copies value by value, 30x
    slower for 8 KiB bodies. A batch holds at most _BATCH_BYTES, so int32 offsets fit."""
    if None in values:  # damage rows: rare, the plain way
        return pa.array(values, type=pa.binary())
    offsets = array("i", [0])
    offsets.extend(accumulate(len(v) for v in values))  # type: ignore[arg-type]
    data = b"".join(values)  # type: ignore[arg-type]
    return pa.Array.from_buffers(pa.binary(), len(values),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


class _Rows:
    """Rows for one Arrow batch at a time (tuples, turned into columns at the flush)."""

    def __init__(self, vhost: str | None = None, queue: str | None = None) -> None:
        self.vhost, self.queue = vhost, queue
        self.rows: list[tuple[Any, ...]] = []
        self.bytes = 0
        self.damaged = 0
        # decoded property blocks by their raw bytes: a publisher often repeats them
        self.props: dict[bytes, tuple[tuple[Any, ...], str | None]] = {}

    def message(self, seq_id: int, msg_id: int | None, delivered: bool, data: bytes, file: str,
                offset: int, stream: tuple[int, int] | None = None) -> None:
        """`stream`: (offset, append time in µs) of a stream's message, which has no body id
        (seq_id is its offset too)."""
        msg = Message.decode(data, msg_id or 0)
        props, problem = self.props.get(msg.props) or self._decode_props(msg)
        self.rows.append((self.vhost, self.queue, seq_id,
                          None if msg_id is None else f"{msg_id:032x}", msg.persistent,
                          delivered, msg.exchange, msg.routing_key, *props, msg.body,
                          len(msg.body), file, offset, *(stream or (None, None)), problem))
        self.bytes += len(msg.body)

    def _decode_props(self, msg: Message) -> tuple[tuple[Any, ...], str | None]:
        try:
            p = msg.properties
            values = [getattr(p, name) for name in _PROPS]
            values[2] = header_strings(values[2])
            got: tuple[tuple[Any, ...], str | None] = (tuple(values), None)
        except ValueError as e:  # the broker delivers the raw bytes; we cannot decode them
            got = ((None,) * len(_PROPS), f"malformed properties: {e}")
        if len(self.props) >= 1024:
            self.props.clear()
        self.props[msg.props] = got
        return got

    def damage(self, what: str, file: str, offset: int, length: int, seq_id: int | None = None,
               msg_id: int | None = None) -> None:
        self.damaged += 1
        log.warning("hare-store: %s damaged at offset %d (%d bytes): %s", file, offset, length,
                    what)
        row: list[Any] = [None] * len(_NAMES)
        row[0], row[1], row[2] = self.vhost, self.queue, seq_id
        row[3] = None if msg_id is None else f"{msg_id:032x}"
        row[_FILE], row[_FILE + 1], row[-1] = file, offset, f"{what} ({length} bytes)"
        self.rows.append(tuple(row))

    def full(self) -> bool:
        return len(self.rows) >= _BATCH_ROWS or self.bytes >= _BATCH_BYTES

    def flush(self) -> Iterator[pa.RecordBatch]:
        if not self.rows:
            return
        columns = list(zip(*self.rows, strict=True))
        arrays = [pa.array(col, type=f.type)
                  for n, (col, f) in enumerate(zip(columns, _ARROW, strict=True)) if n != _BODY]
        arrays.insert(_BODY, _binary(columns[_BODY]))
        self.rows = []
        self.bytes = 0
        yield pa.RecordBatch.from_arrays(arrays, schema=_ARROW)
