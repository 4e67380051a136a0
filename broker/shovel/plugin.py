"""The shovel plugin as the node sees it: the "shovel" runtime parameter component (served at
/api/parameters/shovel and /api/shovels by the management API through
`Node.parameter_components`) and the workers it runs. Definitions are kept in shovels.json in
the data directory, written whole on each change (a handful of small records, each with the
user who defined it: the shovel acts as that user), and started again when the node starts.
Static shovels come from the config file (`Settings.shovels`, checked by hare-server before
the node starts): started with the node, shown in /api/shovels, never stored nor deletable."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import structlog

from broker.shovel.definition import ParameterInvalid, check_static, parse_definition
from broker.shovel.worker import LocalBroker, Shovel

if TYPE_CHECKING:
    from broker.node import Node
    from broker.server.listener import Listener

__all__ = ["COMPONENT", "Shovels"]

log = structlog.get_logger("hare.shovel")

COMPONENT = "shovel"
FILE = "shovels.json"


class Shovels:
    """Every shovel of the node: dynamic ones by (vhost, name), static ones by name."""

    listens: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], dict[str, Any]] = {}
        self._users: dict[tuple[str, str], str] = {}  # who defined each dynamic shovel
        self._running: dict[tuple[str, str], Shovel] = {}
        self._static: dict[str, Shovel] = {}
        self._node: Node | None = None
        self._path: Path | None = None
        self._local: LocalBroker | None = None

    async def start(self, node: Node, listeners: list[Listener]) -> None:
        s = node.settings
        self._node = node
        self._path = Path(s.data_dir) / FILE
        self._local = LocalBroker(node.port, node.auth.direct_secret)
        node.parameter_components[COMPONENT] = self
        for name, definition in check_static(s.shovels):
            # RabbitMQ's static shovels connect locally as its all-powerful internal user;
            # Hare's nearest is the node's default user
            shovel = Shovel("/", name, definition, self._local, self._finished,
                            user=s.default_user, static=True)
            self._static[name] = shovel
            shovel.start()
        for record in self._load():
            try:
                self._apply(record["vhost"], record["name"], record["value"],
                            record.get("user") or s.default_user)
            except (ParameterInvalid, KeyError) as exc:
                log.error("stored shovel not started", vhost=record.get("vhost"),
                          shovel=record.get("name"), reason=str(exc))

    async def stop(self) -> None:
        if self._node is not None:
            self._node.parameter_components.pop(COMPONENT, None)
        for shovel in [*self._running.values(), *self._static.values()]:
            await shovel.stop()
        self._running.clear()
        self._static.clear()

    # -- the parameter component --------------------------------------------------------------
    def parameters(self) -> list[dict[str, object]]:
        return [{"vhost": v, "component": COMPONENT, "name": n, "value": value}
                for (v, n), value in sorted(self._values.items())]

    def put(self, vhost: str, name: str, value: object, user: str | None) -> bool:
        assert self._node is not None
        if vhost not in self._node.vhosts:
            raise ParameterInvalid(f"no vhost '{vhost}'")
        created = (vhost, name) not in self._values
        try:
            self._apply(vhost, name, value, user or self._node.settings.default_user)
        except ParameterInvalid as exc:  # RabbitMQ's form of a parameter's 400
            log.warning("shovel definition refused", vhost=vhost, shovel=name, reason=str(exc))
            raise ParameterInvalid(f"Validation failed\n\n{exc}\n") from None
        self._save()
        return created

    def delete(self, vhost: str, name: str) -> bool:
        if self._values.pop((vhost, name), None) is None:
            return False  # a static shovel is never found here: it has no vhost (as RabbitMQ)
        self._users.pop((vhost, name), None)
        self._stop((vhost, name))
        self._save()
        return True

    def status(self) -> list[dict[str, object]]:
        node = self._node.settings.node_name if self._node is not None else ""
        shovels = [s for _, s in sorted(self._running.items())]
        shovels += [s for _, s in sorted(self._static.items())]
        return [{"node": node, **s.status()} for s in shovels]

    # -- inside -------------------------------------------------------------------------------
    def _apply(self, vhost: str, name: str, value: object, user: str) -> None:
        definition = parse_definition(value)  # raises before anything changes
        assert isinstance(value, dict) and self._local is not None
        self._check_local_vhosts(vhost, definition.src_uris + definition.dest_uris, user)
        key = (vhost, name)
        self._stop(key)
        self._values[key] = value
        self._users[key] = user
        shovel = Shovel(vhost, name, definition, self._local, self._finished, user=user)
        self._running[key] = shovel
        shovel.start()

    def _stop(self, key: tuple[str, str]) -> None:
        shovel = self._running.pop(key, None)
        if shovel is not None:
            # the task ends on its own; nothing of the caller (an HTTP request) waits for it
            _background(shovel.stop())

    def _check_local_vhosts(self, vhost: str, uris: tuple[str, ...], user: str) -> None:
        """A URI of this broker must name a vhost that exists (the plugin's
        validate_params_user); whether the user may use it is the login's to say."""
        assert self._local is not None and self._node is not None
        for uri in uris:
            if self._local.is_local(uri):
                path = unquote(urlsplit(uri).path[1:]) or vhost
                if path not in self._node.vhosts:
                    raise ParameterInvalid(f'user "{user}" may not connect to vhost "{path}"')

    def _finished(self, shovel: Shovel) -> None:
        """src-delete-after reached: the plugin then deletes the shovel's parameter (a static
        shovel stays, terminated)."""
        key = (shovel.vhost, shovel.name)
        if not shovel.static and self._running.get(key) is shovel:
            self._values.pop(key, None)
            self._users.pop(key, None)
            self._running.pop(key, None)
            self._save()
        log.info("shovel done, deleted", vhost=shovel.vhost, shovel=shovel.name,
                 moved=shovel.moved)

    def _load(self) -> list[dict[str, Any]]:
        assert self._path is not None
        try:
            records = json.loads(self._path.read_text())
        except FileNotFoundError:
            return []
        return records if isinstance(records, list) else []

    def _save(self) -> None:
        if self._path is None:
            return
        records = [{"vhost": v, "name": n, "value": value, "user": self._users.get((v, n))}
                   for (v, n), value in sorted(self._values.items())]
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        os.replace(tmp, self._path)  # a crash leaves the old file or the new one, never half


_tasks: set[asyncio.Task[None]] = set()


def _background(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(coro)
    _tasks.add(task)  # held until done: the loop keeps only a weak reference
    task.add_done_callback(_tasks.discard)
