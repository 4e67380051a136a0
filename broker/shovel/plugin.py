"""The shovel plugin as the node sees it: the "shovel" runtime parameter component (served at
/api/parameters/shovel and /api/shovels by the management API through
`Node.parameter_components`) and the workers it runs. Definitions are kept in shovels.json in
the data directory, written whole on each change (a handful of small records, each with the
user who defined it: the shovel acts as that user), and started again when the node starts.
Static shovels come from the config file (`Settings.shovels`, checked by hare-server before
the node starts): started with the node, shown in /api/shovels, never stored nor deletable.

In a cluster (a multi-worker hare-server's workers are one) the definitions are the
cluster's: each change is reported through `Node.changed` (the `parameters` key family,
broker/cluster/families.py) and every node applies the others' (`apply`), keeping its own
shovels.json as a copy. Each shovel runs on one node only, `cluster.runner` of its name (a
static one: of its server's workers), placed again whenever a node starts or stops; the
other nodes' status rows are theirs, gathered by the management API."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.amqp_uri import LocalBroker, uri_vhost
from broker.shovel.definition import (
    ParameterInvalid,
    ShovelDefinition,
    check_static,
    parse_definition,
)
from broker.shovel.worker import Shovel
from broker.store.plugin_records import load_records, save_records

if TYPE_CHECKING:
    from broker.node import Node
    from broker.server.listener import Listener

__all__ = ["COMPONENT", "Shovels"]

log = structlog.get_logger("hare.shovel")

COMPONENT = "shovel"
FILE = "shovels.json"


class Shovels:
    """Every shovel of the node: dynamic ones by (vhost, name), static ones by name; those
    this node runs in `_running` and `_static`."""

    listens: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], dict[str, Any]] = {}
        self._users: dict[tuple[str, str], str] = {}  # who defined each dynamic shovel
        self._running: dict[tuple[str, str], Shovel] = {}
        self._static_defs: list[tuple[str, ShovelDefinition]] = []
        self._static: dict[str, Shovel] = {}
        self._node: Node | None = None
        self._path: Path | None = None
        self._local: LocalBroker | None = None

    def restore(self, node: Node) -> None:
        s = node.settings
        self._node = node
        self._path = Path(s.data_dir) / FILE
        node.parameter_components[COMPONENT] = self
        self._static_defs = check_static(s.shovels)
        for record in load_records(self._path):
            try:
                user = record.get("user") or s.default_user
                definition = parse_definition(record["value"])
                self._check_local_vhosts(record["vhost"],
                                         definition.src_uris + definition.dest_uris, user)
                self._keep(record["vhost"], record["name"], record["value"], user)
            except (ParameterInvalid, KeyError) as exc:
                log.error("stored shovel not started", vhost=record.get("vhost"),
                          shovel=record.get("name"), reason=str(exc))

    async def start(self, node: Node, listeners: list[Listener]) -> None:
        self._local = LocalBroker(node.port, node.auth.direct_secret)
        node.events.nodes_changed.subscribe(self._nodes_changed)
        self._place()

    async def stop(self) -> None:
        if self._node is not None:
            self._node.parameter_components.pop(COMPONENT, None)
            if self._local is not None:
                self._node.events.nodes_changed.unsubscribe(self._nodes_changed)
        self._local = None  # nothing is placed any more
        # side by side: each may take its grace to finish what it holds
        await asyncio.gather(*(shovel.stop() for shovel in [*self._running.values(),
                                                            *self._static.values()]))
        self._running.clear()
        self._static.clear()

    # -- the parameter component --------------------------------------------------------------
    def parameters(self) -> list[dict[str, object]]:
        return [{"vhost": v, "component": COMPONENT, "name": n, "value": value}
                for (v, n), value in sorted(self._values.items())]

    def records(self) -> list[dict[str, object]]:
        return [{"vhost": v, "name": n, "value": value, "user": self._users.get((v, n))}
                for (v, n), value in sorted(self._values.items())]

    def put(self, vhost: str, name: str, value: object, user: str | None) -> bool:
        assert self._node is not None
        if vhost not in self._node.vhosts:
            raise ParameterInvalid(f"no vhost '{vhost}'")
        user = user or self._node.settings.default_user
        created = (vhost, name) not in self._values
        try:
            definition = parse_definition(value)  # raises before anything changes
            self._check_local_vhosts(vhost, definition.src_uris + definition.dest_uris, user)
        except ParameterInvalid as exc:  # RabbitMQ's form of a parameter's 400
            log.warning("shovel definition refused", vhost=vhost, shovel=name, reason=str(exc))
            raise ParameterInvalid(f"Validation failed\n\n{exc}\n") from None
        self._keep(vhost, name, value, user)
        self._node.changed(vhost, "put_parameter",
                           (COMPONENT, {"name": name, "value": value, "user": user}))
        self._save()
        self._replace((vhost, name))
        return created

    def delete(self, vhost: str, name: str) -> bool:
        if not self._forget((vhost, name)):
            return False  # a static shovel is never found here: it has no vhost (as RabbitMQ)
        assert self._node is not None
        self._node.changed(vhost, "delete_parameter", (COMPONENT, {"name": name}))
        return True

    def apply(self, vhost: str, name: str, record: dict[str, object] | None) -> None:
        if record is None:
            self._forget((vhost, name))
            return
        assert self._node is not None
        user = str(record.get("user") or self._node.settings.default_user)
        if self._values.get((vhost, name)) == record["value"] and self._users.get(
                (vhost, name)) == user:
            return  # what we have (our own write, seen before its answer): keep it running
        try:
            self._keep(vhost, name, record["value"], user)
        except ParameterInvalid as exc:
            log.error("cluster's shovel not started", vhost=vhost, shovel=name, reason=str(exc))
            return
        self._save()
        self._replace((vhost, name))

    def status(self) -> list[dict[str, object]]:
        node = self._node.settings.node_name if self._node is not None else ""
        shovels = [s for _, s in sorted(self._running.items())]
        shovels += [s for _, s in sorted(self._static.items())]
        return [{"node": node, **s.status()} for s in shovels]

    # -- inside -------------------------------------------------------------------------------
    def _keep(self, vhost: str, name: str, value: object, user: str) -> None:
        parse_definition(value)  # raises before anything changes
        assert isinstance(value, dict)
        self._values[(vhost, name)] = value
        self._users[(vhost, name)] = user

    def _forget(self, key: tuple[str, str]) -> bool:
        if self._values.pop(key, None) is None:
            return False
        self._users.pop(key, None)
        self._stop(key)
        self._save()
        return True

    def _runs_here(self, key: str, *, same_server: bool = False) -> bool:
        assert self._node is not None
        return self._node.cluster.runner(key, same_server=same_server) == self._node.name

    def _replace(self, key: tuple[str, str]) -> None:
        """A definition changed: the running shovel (if here) restarts with it."""
        self._stop(key)
        self._place()

    def _place(self) -> None:
        """Run here exactly the shovels this node is the runner of; stop the others."""
        if self._local is None or self._node is None:
            return  # not started (restoring) or stopped: nothing runs
        for key, value in sorted(self._values.items()):
            mine = self._runs_here("shovel/" + "/".join(key))
            if mine and key not in self._running:
                shovel = Shovel(key[0], key[1], parse_definition(value), self._local,
                                self._finished, user=self._users[key])
                self._running[key] = shovel
                shovel.start()
            elif not mine:
                self._stop(key)
        for name, definition in self._static_defs:
            mine = self._runs_here("static-shovel/" + name, same_server=True)
            if mine and name not in self._static:
                # RabbitMQ's static shovels connect locally as its all-powerful internal user;
                # Hare's nearest is the node's default user
                static = Shovel("/", name, definition, self._local, self._finished,
                                user=self._node.settings.default_user, static=True)
                self._static[name] = static
                static.start()
            elif not mine and name in self._static:
                _background(self._static.pop(name).stop())

    def _nodes_changed(self, change: tuple[str, bool]) -> None:
        self._place()

    def _stop(self, key: tuple[str, str]) -> None:
        shovel = self._running.pop(key, None)
        if shovel is not None:
            # the task ends on its own; nothing of the caller (an HTTP request) waits for it
            _background(shovel.stop())

    def _check_local_vhosts(self, vhost: str, uris: tuple[str, ...], user: str) -> None:
        """A URI of this broker must name a vhost that exists (the plugin's
        validate_params_user); whether the user may use it is the login's to say."""
        assert self._node is not None
        local = LocalBroker(self._node.port, self._node.auth.direct_secret)
        for uri in uris:
            if local.is_local(uri):
                path = uri_vhost(uri, vhost)
                if path not in self._node.vhosts:
                    raise ParameterInvalid(f'user "{user}" may not connect to vhost "{path}"')

    def _finished(self, shovel: Shovel) -> None:
        """src-delete-after reached: the plugin then deletes the shovel's parameter, for the
        whole cluster (a static shovel stays, terminated)."""
        key = (shovel.vhost, shovel.name)
        if not shovel.static and self._running.get(key) is shovel:
            self._running.pop(key, None)
            self.delete(*key)
        log.info("shovel done, deleted", vhost=shovel.vhost, shovel=shovel.name,
                 moved=shovel.moved)

    def _save(self) -> None:
        if self._path is None:
            return
        save_records(self._path, self.records())


_tasks: set[asyncio.Task[None]] = set()


def _background(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(coro)
    _tasks.add(task)  # held until done: the loop keeps only a weak reference
    task.add_done_callback(_tasks.discard)
