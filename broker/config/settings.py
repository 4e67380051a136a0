"""The Settings object: every tunable of the broker, its default and what values it accepts.

One flat, frozen dataclass. A field's name is its TOML key; `HARE_<NAME>` is its environment
variable and `--<name-with-dashes>` its flag, so the three sources map one to one. Each field's
metadata carries its parser (see values.py) and the help text shown by `hare-server --help`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.config import values as v
from broker.config.values import (
    AuthHttpMethod,
    CertLoginFrom,
    Fsync,
    LogFormat,
    MemoryWatermark,
    Parser,
    PermissionSpec,
    ShovelSpec,
    SslVerify,
    TlsVersion,
    Unroutable,
    UserSpec,
)

__all__ = ["ENV_PREFIX", "Settings", "env_name", "flag_name", "key_info"]

ENV_PREFIX = "HARE_"
_MiB = 1024 * 1024


def _m(
    parse: Parser, help: str, *, file_only: bool = False, secret: bool = False
) -> dict[str, Any]:
    return {"parse": parse, "help": help, "file_only": file_only, "secret": secret}


@dataclass(frozen=True)
class Settings:
    # listeners
    host: str = field(
        default="",
        metadata=_m(
            v.string_value, "AMQP listener address; empty means all interfaces, IPv4 and IPv6"
        ),
    )
    port: int = field(
        default=5672, metadata=_m(v.int_value(0, 65535), "AMQP listener port (0: any free port)")
    )
    # AMQPS: RabbitMQ's listeners.ssl and ssl_options; the listener is on when ssl_certfile is set
    ssl_port: int = field(
        default=5671,
        metadata=_m(
            v.int_value(0, 65535),
            "AMQPS (AMQP over TLS) port, used when ssl_certfile is set (0: any free port)",
        ),
    )
    ssl_certfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM server certificate (chain); turns AMQPS on"),
    )
    ssl_keyfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM private key of ssl_certfile (unset: in it)"),
    )
    ssl_cacertfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM CA certificates that client certificates chain to"),
    )
    ssl_verify: SslVerify = field(
        default=SslVerify.VERIFY_NONE,
        metadata=_m(
            v.choice_value(SslVerify),
            "verify_peer: ask clients for a certificate and check it; verify_none: don't",
        ),
    )
    ssl_fail_if_no_peer_cert: bool = field(
        default=False,
        metadata=_m(v.bool_value, "with verify_peer, refuse a client that sends no certificate"),
    )
    ssl_min_version: TlsVersion = field(
        default=TlsVersion.TLS1_2,
        metadata=_m(v.choice_value(TlsVersion), "oldest TLS version accepted: tlsv1.2 or tlsv1.3"),
    )
    ssl_handshake_timeout_s: float = field(
        default=5.0,
        metadata=_m(v.float_value(0, lo_open=True), "time a client has for the TLS handshake"),
    )
    data_dir: Path = field(
        default=Path("./data"),
        metadata=_m(v.path_value, "directory of the message store, queue indexes and definitions"),
    )
    # connection tuning, offered in connection.tune
    frame_max: int = field(
        default=131072, metadata=_m(v.int_value(4096, 2**32 - 1), "largest frame in bytes")
    )
    heartbeat_s: int = field(
        default=60, metadata=_m(v.int_value(0, 65535), "heartbeat interval offered (0: off)")
    )
    channel_max: int = field(
        default=2047,
        metadata=_m(
            v.int_value(0, 65535), "most channels per connection (0: no limit but the protocol's)"
        ),
    )
    consumer_max_per_channel: int = field(
        default=0,
        metadata=_m(
            v.int_value(0),
            "most consumers one channel may have (0: no limit, as RabbitMQ); one more is 530",
        ),
    )
    max_message_size: int = field(
        default=128 * _MiB,
        metadata=_m(
            v.size_value(1, 512 * _MiB),
            "largest message body accepted; a content header announcing more is refused",
        ),
    )
    handshake_timeout_s: float = field(
        default=10.0,
        metadata=_m(
            v.float_value(0, lo_open=True), "time a client has to finish the AMQP handshake"
        ),
    )
    # access control
    default_vhost: str = field(
        default="/", metadata=_m(v.nonempty_string_value, "vhost created on first boot")
    )
    default_user: str = field(
        default="guest", metadata=_m(v.nonempty_string_value, "user created on first boot")
    )
    default_pass: str = field(
        default="guest",
        repr=False,
        metadata=_m(v.string_value, "password of default_user", secret=True),
    )
    loopback_users: tuple[str, ...] = field(
        default=("guest",),
        metadata=_m(
            v.string_list_value,
            "users that may only connect from localhost (comma-separated in env and flags)",
        ),
    )
    auth_mechanisms: tuple[str, ...] = field(
        default=("PLAIN", "AMQPLAIN"),
        metadata=_m(
            v.mechanisms_value,
            "SASL mechanisms offered: PLAIN, AMQPLAIN, EXTERNAL (client certificate, AMQPS only)",
        ),
    )
    ssl_cert_login_from: CertLoginFrom = field(
        default=CertLoginFrom.COMMON_NAME,
        metadata=_m(
            v.choice_value(CertLoginFrom),
            "EXTERNAL's user name: the certificate's common_name or distinguished_name",
        ),
    )
    users: tuple[UserSpec, ...] = field(
        default=(),
        metadata=_m(v.users_value, "users to declare at boot ([[users]] tables)", file_only=True),
    )
    vhosts: tuple[str, ...] = field(
        default=(),
        metadata=_m(v.string_list_value, "vhosts to declare at boot besides default_vhost"),
    )
    permissions: tuple[PermissionSpec, ...] = field(
        default=(),
        metadata=_m(
            v.permissions_value,
            "permissions to set at boot ([[permissions]] tables)",
            file_only=True,
        ),
    )
    # static shovels (RabbitMQ's shovel plugin `shovels` setting)
    shovels: tuple[ShovelSpec, ...] = field(
        default=(),
        metadata=_m(
            v.shovels_value,
            "static shovels started at boot ([[shovels]] tables, docs/SHOVEL.md)",
            file_only=True,
        ),
    )
    # auth backends (RabbitMQ's auth_backends and rabbitmq_auth_backend_http)
    auth_backends: tuple[str, ...] = field(
        default=("internal",),
        metadata=_m(
            v.auth_backends_value,
            "login and permission backends tried in order: internal, http (comma-separated)",
        ),
    )
    auth_http_user_path: str = field(
        default="", metadata=_m(v.url_value, "HTTP auth backend: URL asked who may log in")
    )
    auth_http_vhost_path: str = field(
        default="", metadata=_m(v.url_value, "HTTP auth backend: URL asked for vhost access")
    )
    auth_http_resource_path: str = field(
        default="",
        metadata=_m(v.url_value, "HTTP auth backend: URL asked for exchange/queue permissions"),
    )
    auth_http_topic_path: str = field(
        default="",
        metadata=_m(v.url_value, "HTTP auth backend: URL asked for routing keys (optional)"),
    )
    auth_http_method: AuthHttpMethod = field(
        default=AuthHttpMethod.GET,
        metadata=_m(v.choice_value(AuthHttpMethod), "HTTP auth backend: get or post"),
    )
    auth_http_timeout_s: float = field(
        default=5.0,
        metadata=_m(
            v.float_value(0, lo_open=True),
            "HTTP auth backend: no answer within this long is a refusal",
        ),
    )
    auth_http_cache_ttl_s: float = field(
        default=5.0,
        metadata=_m(v.float_value(0), "HTTP auth backend: how long answers are cached (0: not)"),
    )
    # credit flow (rabbit's credit_flow_default_credit = {400, 200})
    credit_flow_initial_credit: int = field(
        default=400, metadata=_m(v.int_value(1), "credit a sender starts with, per link")
    )
    credit_flow_more_credit_after: int = field(
        default=200,
        metadata=_m(v.int_value(1), "messages a receiver handles before granting more credit"),
    )
    # memory and disk alarms
    vm_memory_high_watermark: MemoryWatermark = field(
        default=MemoryWatermark(relative=0.4),
        metadata=_m(
            v.watermark_value,
            "memory alarm threshold: fraction of total memory, or a size like 2GiB",
        ),
    )
    vm_memory_high_watermark_paging_ratio: float = field(
        default=0.5,
        metadata=_m(
            v.float_value(0, lo_open=True),
            "fraction of the watermark at which queues page messages out (>1: never)",
        ),
    )
    partial_content_ratio: float = field(
        default=0.2,
        metadata=_m(
            v.float_value(0, 1, lo_open=True),
            "share of the memory alarm limit that bodies of messages still arriving may hold "
            "before the connections holding the most stop being read",
        ),
    )
    memory_monitor_interval_s: float = field(
        default=0.25, metadata=_m(v.float_value(0, lo_open=True), "how often memory use is sampled")
    )
    disk_free_limit: int = field(
        default=50_000_000,
        metadata=_m(v.size_value(), "disk alarm when free space on data_dir falls below (bytes)"),
    )
    blocked_timeout_s: float = field(
        default=0.0,
        metadata=_m(
            v.float_value(0), "close a connection blocked by an alarm for this long (0: never)"
        ),
    )
    # message store and queue index
    msg_store_file_size_limit: int = field(
        default=16 * _MiB,
        metadata=_m(v.size_value(1), "size at which a store segment file rolls over"),
    )
    msg_store_gc_garbage_fraction: float = field(
        default=0.5,
        metadata=_m(
            v.float_value(0, 1, lo_open=True),
            "garbage fraction of the store that triggers compaction",
        ),
    )
    msg_store_gc_min_files: int = field(
        default=3, metadata=_m(v.int_value(1), "no compaction with fewer segment files than this")
    )
    fsync: Fsync = field(
        default=Fsync.BATCH,
        metadata=_m(v.choice_value(Fsync), "fsync policy of the stores: always, batch or never"),
    )
    queue_index_embed_msgs_below: int = field(
        default=4096,
        metadata=_m(v.size_value(), "messages smaller than this (bytes) live in the queue index"),
    )
    queue_index_segment_entries: int = field(
        default=16384, metadata=_m(v.int_value(1), "entries per queue index segment file")
    )
    # logs
    log_level: str = field(
        default="info", metadata=_m(v.log_level_value, "debug, info, warning, error or critical")
    )
    log_format: LogFormat = field(
        default=LogFormat.AUTO,
        metadata=_m(
            v.choice_value(LogFormat), "console, json, or auto (console on a terminal, else json)"
        ),
    )
    # management HTTP API
    management_host: str = field(
        default="",
        metadata=_m(v.string_value, "management listener address; empty means all interfaces"),
    )
    management_port: int = field(
        default=15672,
        metadata=_m(v.int_value(0, 65535), "management HTTP port (0: management off)"),
    )
    # management HTTPS: RabbitMQ's management.ssl.*; on when management_ssl_certfile is set
    management_ssl_port: int = field(
        default=15671,
        metadata=_m(
            v.int_value(0, 65535),
            "management HTTPS port, used when management_ssl_certfile is set (0: any free port)",
        ),
    )
    management_ssl_certfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM certificate of the HTTPS listener; turns it on"),
    )
    management_ssl_keyfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM private key of management_ssl_certfile"),
    )
    management_ssl_cacertfile: Path | None = field(
        default=None,
        metadata=_m(v.optional_path_value, "PEM CA certificates for HTTPS client certificates"),
    )
    management_ssl_verify: SslVerify = field(
        default=SslVerify.VERIFY_NONE,
        metadata=_m(v.choice_value(SslVerify), "verify_peer or verify_none, as ssl_verify"),
    )
    management_ssl_fail_if_no_peer_cert: bool = field(
        default=False,
        metadata=_m(v.bool_value, "with verify_peer, refuse an HTTPS client without certificate"),
    )
    management_ssl_min_version: TlsVersion = field(
        default=TlsVersion.TLS1_2,
        metadata=_m(v.choice_value(TlsVersion), "oldest TLS version of the HTTPS listener"),
    )
    # processes (docs/ARCHITECTURE.md, "Process tree")
    workers: int = field(
        default=0,
        metadata=_m(
            v.workers_value,
            "worker processes, each a node of a private cluster (with cluster_etcd: of that "
            "cluster) behind the one set of ports: "
            "auto (shown as 0) is the cores this process may use, cgroup CPU limit included; "
            "1 is a single process",
        ),
    )
    connection_placement: bool = field(
        default=True,
        metadata=_m(
            v.bool_value,
            "with workers > 1: a plain-TCP connection whose first publish or consume is for "
            "queues of one other worker is handed over to that worker (docs/ARCHITECTURE.md, "
            "\"Where connections live\")",
        ),
    )
    # identity and cluster (docs/CLUSTER.md)
    node_name: str = field(
        default="",
        metadata=_m(
            v.string_value,
            "this node's name, kept across restarts and re-created containers "
            "(empty: hare@<hostname>)",
        ),
    )
    cluster_etcd: str = field(
        default="",
        metadata=_m(
            v.string_value,
            "etcd client URL(s), comma-separated, holding the cluster (empty: a single node)",
        ),
    )
    cluster_name: str = field(
        default="hare",
        metadata=_m(v.nonempty_string_value, "the cluster's name: its key prefix in etcd"),
    )
    cluster_server: str = field(
        default="",
        metadata=_m(
            v.string_value,
            "the server (machine, disk) this node runs in: quorum queue members go to "
            "distinct servers (empty: the node's own name; a multi-worker hare-server names "
            "its workers' server after itself)",
        ),
    )
    cluster_secret: str = field(
        default="",
        repr=False,
        metadata=_m(
            v.string_value,
            "shared secret the nodes prove to each other on the inter-node link "
            "(required with cluster_etcd; the role of Erlang's cookie)",
            secret=True,
        ),
    )
    cluster_etcd_token: str = field(
        default="",
        repr=False,
        metadata=_m(
            v.string_value,
            "token sent to cluster_etcd on every call (a multi-worker server's meta server "
            "wants it; set by the parent, through the environment)",
            secret=True,
        ),
    )
    cluster_link_host: str = field(
        default="",
        metadata=_m(v.string_value, "inter-node link listener address (empty: all interfaces)"),
    )
    cluster_link_port: int = field(
        default=25672,
        metadata=_m(v.int_value(0, 65535), "inter-node link port (0: any free port)"),
    )
    cluster_link_advertise: str = field(
        default="",
        metadata=_m(
            v.string_value,
            "address the other nodes dial for the link (empty: cluster_link_host, else the "
            "hostname)",
        ),
    )
    cluster_lease_ttl_s: int = field(
        default=10,
        metadata=_m(
            v.int_value(2, 600),
            "etcd lease TTL: a node silent this long is down for the cluster",
        ),
    )
    queue_master_locator: str = field(
        default="auto",
        metadata=_m(
            v.locator_value,
            "home of a new queue without x-queue-master-locator / x-queue-leader-locator: "
            "client-local (the declaring node or worker), balanced (min-masters: the node "
            "with the fewest queues) or auto (client-local, except that with workers > 1 and "
            "connection_placement the worker of this server with the fewest queues: its "
            "connections follow their queues there)",
        ),
    )
    quorum_initial_group_size: int = field(
        default=3,
        metadata=_m(
            v.int_value(1, 64),
            "members of a new quorum queue without x-quorum-initial-group-size (at most the "
            "running nodes; RabbitMQ's quorum_cluster_size)",
        ),
    )
    # semantics
    unroutable: Unroutable = field(
        default=Unroutable.ACK,
        metadata=_m(
            v.choice_value(Unroutable),
            "confirm for a non-mandatory unroutable message: ack (as RabbitMQ) or nack",
        ),
    )

    def redacted(self) -> dict[str, object]:
        """Plain values for a start-up log line, with passwords and hashes left out."""
        shown: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"]:
                value = "***"
            elif f.name == "users":
                value = [{"name": user.name, "tags": list(user.tags)} for user in value]
            elif f.name == "shovels":
                value = [shovel.shown() for shovel in value]
            elif isinstance(value, tuple):
                value = [dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x for x in value]
            elif isinstance(value, Path | MemoryWatermark):
                value = str(value)
            shown[f.name] = value
        return shown


def key_info() -> dict[str, dataclasses.Field[Any]]:
    """Every key by name, with the dataclass field that carries its parser and help."""
    return {f.name: f for f in dataclasses.fields(Settings)}


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")
