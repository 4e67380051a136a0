"""The federation plugin as the node sees it: the `federation-upstream` and
`federation-upstream-set` runtime parameter components (served at /api/parameters/... and
/api/federation-links by the management API through `Node.parameter_components`), and the
links the policies call for.

Which links run is worked out again, whole, one loop turn after any definition change
(the node's `definition_changed` event: an exchange, queue, binding or policy) and after any
upstream or set change: every exchange and queue whose policy names an upstream (or a set, or
`all`) gets one link per upstream; exchange links are told the exchange's bindings. A turn
costs a walk over the vhosts' exchanges and queues, not a message. Parameters are kept in
federation.json in the data directory, as the shovel plugin keeps shovels.json, each with the
user who defined it: an upstream's links act on this broker as that user.

In a cluster (a multi-worker hare-server's workers are one) upstreams and sets are the
cluster's, as shovels are (broker/shovel/plugin.py), and each link runs on one node: a
queue's on the queue's home node (which knows its consumers and depth), an exchange's on
`cluster.runner` of its key, placed again whenever a node starts or stops. Links name
themselves upstream after the server (`Node.server`), not the worker, so a link that moves
keeps its upstream queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.amqp_uri import LocalBroker
from broker.federation.link import ExchangeLink, Link, QueueLink
from broker.federation.upstream import (
    ParameterInvalid,
    Upstream,
    parse_upstream,
    parse_upstream_set,
    with_overrides,
)
from broker.store.plugin_records import load_records, save_records

if TYPE_CHECKING:
    from collections.abc import Mapping

    from broker.node import Node
    from broker.server.listener import Listener
    from broker.vhost import VHost

__all__ = ["UPSTREAM", "UPSTREAM_SET", "Federation"]

log = structlog.get_logger("hare.federation")

UPSTREAM = "federation-upstream"
UPSTREAM_SET = "federation-upstream-set"
FILE = "federation.json"
_INTERNAL = "x-internal-purpose"  # the federation's own objects on an upstream: never federated

LinkKey = tuple[str, str, str, str]  # (kind, vhost, exchange or queue, upstream)


class _Component:
    """One of the plugin's two parameter components; the plugin holds the values."""

    def __init__(self, plugin: Federation, name: str,
                 parse: Callable[[str, object], object]) -> None:
        self.plugin, self.name, self._parse = plugin, name, parse
        self.values: dict[tuple[str, str], Any] = {}  # (vhost, name) -> the value as given
        self.parsed: dict[tuple[str, str], Any] = {}
        self.users: dict[tuple[str, str], str] = {}  # who defined each: links act as them

    def parameters(self) -> list[dict[str, object]]:
        return [{"vhost": v, "component": self.name, "name": n, "value": value}
                for (v, n), value in sorted(self.values.items())]

    def records(self) -> list[dict[str, object]]:
        return [{"vhost": v, "name": n, "value": value, "user": self.users.get((v, n))}
                for (v, n), value in sorted(self.values.items())]

    def put(self, vhost: str, name: str, value: object, user: str | None) -> bool:
        try:
            self.plugin.check_vhost(vhost)
            user = user or self.plugin.default_user()
            created = self.set(vhost, name, value, user)
        except ParameterInvalid as exc:
            log.warning("federation parameter refused", component=self.name, vhost=vhost,
                        name=name, user=user, reason=str(exc))
            raise
        self.plugin.report(vhost, "put_parameter",
                           (self.name, {"name": name, "value": value, "user": user}))
        self.plugin.changed()
        return created

    def set(self, vhost: str, name: str, value: object, user: str) -> bool:
        parsed = self._parse(name, value)  # raises before anything changes
        created = (vhost, name) not in self.values
        self.values[(vhost, name)], self.parsed[(vhost, name)] = value, parsed
        self.users[(vhost, name)] = user
        return created

    def delete(self, vhost: str, name: str) -> bool:
        if not self._drop(vhost, name):
            return False
        self.plugin.report(vhost, "delete_parameter", (self.name, {"name": name}))
        self.plugin.changed()
        return True

    def apply(self, vhost: str, name: str, record: dict[str, object] | None) -> None:
        if record is None:
            if not self._drop(vhost, name):
                return
        else:
            user = str(record.get("user") or self.plugin.default_user())
            if self.values.get((vhost, name)) == record["value"] and self.users.get(
                    (vhost, name)) == user:
                return  # what we have (our own write, seen before its answer)
            try:
                self.set(vhost, name, record["value"], user)
            except ParameterInvalid as exc:
                log.error("cluster's federation parameter not loaded", component=self.name,
                          vhost=vhost, name=name, reason=str(exc))
                return
        self.plugin.changed()

    def _drop(self, vhost: str, name: str) -> bool:
        if self.values.pop((vhost, name), None) is None:
            return False
        self.parsed.pop((vhost, name), None)
        self.users.pop((vhost, name), None)
        return True

    def drop_vhost(self, vhost: str) -> bool:
        """The vhost is deleted: its parameters go with it, as RabbitMQ's."""
        gone = [key for key in self.values if key[0] == vhost]
        for key in gone:
            self._drop(*key)
            # the node where the vhost was deleted deletes them from the cluster too
            self.plugin.report(vhost, "delete_parameter", (self.name, {"name": key[1]}))
        return bool(gone)

    def status(self) -> list[dict[str, object]]:
        """Every link (GET /api/federation-links), whichever component is asked."""
        return self.plugin.links_status()


class Federation:
    """Every upstream, set and link of the node."""

    listens: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.upstreams = _Component(self, UPSTREAM, parse_upstream)
        self.sets = _Component(self, UPSTREAM_SET, parse_upstream_set)
        self.links: dict[LinkKey, Link] = {}
        self._node: Node | None = None
        self._path: Path | None = None
        self._local: LocalBroker | None = None
        self._scheduled = False
        self._stopping: set[asyncio.Task[None]] = set()

    def restore(self, node: Node) -> None:
        s = node.settings
        self._node = node
        self._path = Path(s.data_dir) / FILE
        for component in (self.upstreams, self.sets):
            node.parameter_components[component.name] = component
        for record in load_records(self._path):
            component = self.upstreams if record.get("component") == UPSTREAM else self.sets
            try:
                # records from before users were kept act as the default user
                component.set(record["vhost"], record["name"], record["value"],
                              record.get("user") or s.default_user)
            except (ParameterInvalid, KeyError) as exc:
                log.error("stored federation parameter not loaded", record=record,
                          reason=str(exc))

    async def start(self, node: Node, listeners: list[Listener]) -> None:
        self._local = LocalBroker(node.port, node.auth.direct_secret)
        node.events.definition_changed.subscribe(self._definition_changed)
        node.events.nodes_changed.subscribe(self._nodes_changed)
        self._reconcile()

    async def stop(self) -> None:
        if self._node is not None:
            if self._local is not None:
                self._node.events.definition_changed.unsubscribe(self._definition_changed)
                self._node.events.nodes_changed.unsubscribe(self._nodes_changed)
            for name in (UPSTREAM, UPSTREAM_SET):
                self._node.parameter_components.pop(name, None)
            self._node = None
        self._local = None
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.stop() for link in links), *self._stopping)

    # -- what the components call -----------------------------------------------------------
    def default_user(self) -> str:
        """Whom a parameter set by no user (none is known) acts as."""
        assert self._node is not None  # components are registered only once started
        return self._node.settings.default_user

    def check_vhost(self, vhost: str) -> None:
        if self._node is not None and vhost not in self._node.vhosts:
            raise ParameterInvalid(f"no vhost '{vhost}'")

    def report(self, vhost: str, what: str, obj: object) -> None:
        """A parameter changed here: the cluster (the other workers) is told."""
        if self._node is not None:
            self._node.changed(vhost, what, obj)

    def changed(self) -> None:
        """An upstream or a set changed: keep it, and the links follow on the next turn."""
        self._save()
        self._soon()

    def links_status(self) -> list[dict[str, object]]:
        node = self._node.name if self._node is not None else ""
        return [link.row(node) for _, link in sorted(self.links.items())]

    # -- which links run --------------------------------------------------------------------
    def _definition_changed(self, change: tuple[str | None, str, object]) -> None:
        _, what, obj = change
        if what == "delete_vhost" and isinstance(obj, str):
            dropped = [c.drop_vhost(obj) for c in (self.upstreams, self.sets)]
            if any(dropped):
                self._save()
        self._soon()

    def _nodes_changed(self, change: tuple[str, bool]) -> None:
        self._soon()  # exchange links are placed again

    def _soon(self) -> None:
        """Once per loop turn however many changes came (a policy is reported before it is
        applied, so the turn after sees it applied)."""
        if self._scheduled or self._node is None or not (self.upstreams.parsed or self.links):
            return  # nothing to federate: a definition change costs one test here
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._reconcile)

    def _reconcile(self) -> None:
        self._scheduled = False
        node, local = self._node, self._local
        if node is None or local is None:
            return
        wanted: dict[LinkKey, tuple[Upstream, str]] = {}  # the upstream and who defined it
        bindings: dict[LinkKey, list[tuple[str, dict[str, Any]]]] = {}
        types: dict[LinkKey, str] = {}
        elsewhere: set[LinkKey] = set()  # wanted, but another node runs it
        for vhost in node.vhosts.values():
            for ex in vhost.exchanges.values():
                if ex.name == "" or _INTERNAL in (ex.arguments or {}):
                    continue
                definition = ex.policy.definition if ex.policy is not None else None
                for entry in self._upstreams_for(vhost, definition):
                    key = ("exchange", vhost.name, ex.name, entry[0].name)
                    if node.cluster.runner("federation/" + "/".join(key)) != node.name:
                        elsewhere.add(key)
                        continue
                    wanted[key], types[key] = entry, ex.type
                    bindings[key] = [(b.routing_key, b.arguments_dict()) for b in ex.bindings()]
            for q in vhost.queues.values():
                policy = q.args.applied.policy
                if _INTERNAL in q.arguments or q.exclusive_owner is not None:
                    continue
                definition = policy.definition if policy is not None else None
                for entry in self._upstreams_for(vhost, definition):
                    key = ("queue", vhost.name, q.name, entry[0].name)
                    if q.home not in (None, node.name):
                        elsewhere.add(key)  # its home node runs its links
                    else:
                        wanted[key] = entry
        for key, link in list(self.links.items()):
            if key not in wanted:  # for good, unless it moved: what it declared upstream too
                del self.links[key]
                self._stop(link, cleanup=key not in elsewhere)
            elif wanted[key] != (link.upstream, link.user) or (
                    isinstance(link, ExchangeLink) and link.exchange_type != types[key]):
                del self.links[key]  # restarted with its new upstream keys: nothing lost
                self._stop(link, cleanup=False)
        for key, (upstream, user) in wanted.items():
            found = self.links.get(key)
            if found is not None:
                link = found
            else:
                kind, vname, name, _ = key
                if kind == "exchange":
                    link = ExchangeLink(vname, name, upstream, node.server, local, types[key],
                                        user=user)
                else:
                    link = QueueLink(vname, name, upstream, node.server, local,
                                     self._demand(vname, name),
                                     user=user)
                self.links[key] = link
                link.start()
            if isinstance(link, ExchangeLink):
                link.set_bindings(bindings[key])

    def _upstreams_for(self, vhost: VHost, definition: Mapping[str, Any] | None
                       ) -> list[tuple[Upstream, str]]:
        """The upstreams a policy names: one, a set's members, or every one of the vhost;
        each with the user who defined it (a set member's too: the upstream's, not the
        set's), whom its links act as on this broker."""
        if not definition:
            return []
        name, set_name = definition.get(UPSTREAM), definition.get(UPSTREAM_SET)
        if isinstance(name, str):
            members: list[Mapping[str, Any]] = [{"upstream": name}]
        elif set_name == "all":
            members = [{"upstream": n} for (v, n) in sorted(self.upstreams.parsed)
                       if v == vhost.name]
        elif isinstance(set_name, str):
            members = self.sets.parsed.get((vhost.name, set_name), [])
        else:
            return []
        out: list[tuple[Upstream, str]] = []
        for member in members:
            key = (vhost.name, member["upstream"])
            base = self.upstreams.parsed.get(key)
            if base is not None:  # a set may name an upstream not defined (yet): skipped
                out.append((with_overrides(base, member), self.upstreams.users[key]))
        return out

    def _demand(self, vhost: str, name: str) -> Callable[[], bool]:
        """A queue link fetches while its queue has consumers and nothing ready."""
        def demand() -> bool:
            v = self._node.vhosts.get(vhost) if self._node is not None else None
            q = v.queues.get(name) if v is not None else None
            return q is not None and q.consumer_count > 0 and q.message_count == 0
        return demand

    def _stop(self, link: Link, cleanup: bool) -> None:
        # the link's task ends on its own; nothing of the caller (an HTTP request) waits
        task = asyncio.ensure_future(link.stop(cleanup))
        self._stopping.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._stopping.discard)

    # -- the file ---------------------------------------------------------------------------
    def _save(self) -> None:
        if self._path is None:
            return
        records = [{"component": c.name, "vhost": v, "name": n, "value": value,
                    "user": c.users.get((v, n))}
                   for c in (self.upstreams, self.sets)
                   for (v, n), value in sorted(c.values.items())]
        save_records(self._path, records)
