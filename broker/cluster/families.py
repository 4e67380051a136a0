"""The cluster's metadata as key families: one family per kind of definition.

A family says which change events it stores (the `what` of `Node.changed`), the key of an
object under `/hare/<cluster>/meta/<family>/`, the JSON record that describes it, and how a
record becomes local state on a node (`apply`, also called with None for a deletion). A new
kind of definition (topic permissions, user limits, ...) is one more `Family` in `FAMILIES`
and its events sent through `Node.changed`; nothing else in the cluster code changes.

Records are RabbitMQ's definitions JSON where one exists; AMQP field tables (arguments) are
stored with the definitions database's tagged encoding, which round-trips every AMQP value."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import structlog

from broker.routing.exchange import Exchange
from broker.store.definitions import decode_table, encode_table

if TYPE_CHECKING:
    from broker.node import Node

__all__ = ["FAMILIES", "Family", "family_of_event", "key_parts", "record_key"]

log = structlog.get_logger("hare.cluster")

Record = dict[str, Any]


@dataclass(frozen=True)
class Family:
    name: str  # the key family: meta/<name>/...
    put_event: str  # Node.changed's `what` for a create or update
    delete_event: str  # ... and for a deletion
    key: Callable[[str | None, Any], tuple[str, ...]]  # (vhost, obj) -> the key's parts
    record: Callable[[str | None, Any], Record]  # (vhost, obj) -> JSON record
    apply: Callable[[Node, tuple[str, ...], Record | None], None]  # record -> local state
    order: int  # full reads apply families in this order (vhosts before what is in them)
    objects: Callable[[Node], Iterable[tuple[str | None, Any]]]  # what a node has: (vhost, obj)

    def local(self, node: Node) -> list[tuple[str, ...]]:
        """The keys of what this node has of the family."""
        return [self.key(vhost, obj) for vhost, obj in self.objects(node)]


def record_key(family: str, parts: tuple[str, ...]) -> str:
    return family + "/" + "/".join(quote(p, safe="") for p in parts)


def key_parts(key: str) -> tuple[str, tuple[str, ...]]:
    family, _, rest = key.partition("/")
    return family, tuple(unquote(p) for p in rest.split("/"))


# -- vhosts, users, permissions ----------------------------------------------------------------
def _apply_vhost(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    if rec is not None:
        node.add_vhost(parts[0])
    elif parts[0] in node.vhosts:
        node.remove_vhost(parts[0])


def _apply_user(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    if rec is None:
        user = node.users.users.get(parts[0])
        if user is not None:
            node.users.delete_user(user.name)
            node.changed(None, "delete_user", user)
            node.close_connections(user=user.name, reason=f"user '{user.name}' is deleted")
    else:
        node.changed(None, "put_user", node.users.add_user(
            parts[0], password_hash=rec["password_hash"], tags=list(rec["tags"])))


def _apply_permission(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost, user = parts
    if rec is None:
        if node.users.clear_permissions(user, vhost):
            node.changed(vhost, "delete_permission", (user,))
    else:
        patterns = (rec["configure"], rec["write"], rec["read"])
        node.users.set_permissions(user, vhost, *patterns)
        node.changed(vhost, "put_permission", (user, *patterns))


def _apply_topic_permission(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost, user, exchange = parts
    if rec is None:
        if node.users.clear_topic_permissions(user, vhost, exchange):
            node.changed(vhost, "delete_topic_permission", (user, exchange))
    elif user in node.users.users:
        node.users.set_topic_permission(user, vhost, exchange, rec["write"], rec["read"])
        node.changed(vhost, "put_topic_permission", (user, exchange, rec["write"], rec["read"]))


def _topic_permissions(node: Node) -> Iterable[tuple[str | None, Any]]:
    return [(vhost, (user, p.exchange, p.write, p.read))
            for (user, vhost), per_exchange in node.users.topic_perms.items()
            for p in per_exchange.values()]


def _apply_user_limit(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    user, name = parts
    if user not in node.users.users:
        return
    if rec is None:
        if node.users.clear_limit(user, name):
            node.changed(None, "delete_user_limit", (user, name))
    else:
        node.users.set_limit(user, name, rec["value"])
        node.changed(None, "put_user_limit", (user, name, rec["value"]))


# -- policies and limits -----------------------------------------------------------------------
def _policy_record(vhost: str | None, policy: Any) -> Record:
    return {"vhost": vhost, "name": policy.name, "body": policy.body()}


def _apply_policy(operator: bool) -> Callable[[Node, tuple[str, ...], Record | None], None]:
    def apply(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
        from broker.policy import PolicyInvalid, parse_policy

        vhost = node.vhosts.get(parts[0])
        if vhost is None:
            return
        if rec is None:
            vhost.params.clear_policy(parts[1], operator)
            return
        try:
            policy = parse_policy(parts[0], parts[1], rec["body"], operator=operator)
        except PolicyInvalid as exc:
            log.warning("cluster policy ignored", vhost=parts[0], policy=parts[1],
                        reason=exc.reason)
            return
        vhost.params.put_policy(policy)

    return apply


def _apply_limits(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost = node.vhosts.get(parts[0])
    if vhost is not None:
        vhost.params.set_limits(dict(rec["value"]) if rec is not None else {})


# -- plugins' runtime parameters (shovels, federation upstreams and sets) -----------------------
def _parameter_key(vhost: str | None, p: Any) -> tuple[str, ...]:
    return (str(vhost), p[0], p[1]["name"])


def _parameter_record(vhost: str | None, p: Any) -> Record:
    return {"vhost": vhost, "component": p[0], "name": p[1]["name"],
            "value": p[1]["value"], "user": p[1].get("user")}


def _apply_parameter(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost, component, name = parts
    plugin = node.parameter_components.get(component)
    if plugin is not None:  # a plugin this node does not run: nothing to apply
        plugin.apply(vhost, name, rec)


def _parameters(node: Node) -> Iterable[tuple[str | None, Any]]:
    """(vhost, (component, record)): what `Node.changed` reports as put_parameter."""
    return [(str(r["vhost"]), (name, r)) for name, c in node.parameter_components.items()
            for r in c.records()]


# -- exchanges, queues, bindings ---------------------------------------------------------------
def _exchange_record(vhost: str | None, ex: Any) -> Record:
    return {"vhost": vhost, "name": ex.name, "type": ex.type, "durable": ex.durable,
            "auto_delete": ex.auto_delete, "internal": ex.internal,
            "arguments": encode_table(ex.arguments)}


def _apply_exchange(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost = node.vhosts.get(parts[0])
    if vhost is None:
        return
    if rec is None:
        if parts[1] in vhost.exchanges:
            vhost.delete_exchange(parts[1])
        return
    if parts[1] not in vhost.exchanges:
        vhost.add_exchange(parts[1], rec["type"], durable=rec["durable"],
                           auto_delete=rec["auto_delete"], internal=rec["internal"],
                           arguments=decode_table(rec["arguments"]))


def _queue_record(vhost: str | None, q: Any) -> Record:
    record = {"vhost": vhost, "name": q.name, "durable": q.durable,
              "auto_delete": q.auto_delete, "exclusive": q.exclusive_owner is not None,
              "arguments": encode_table(q.arguments), "node": q.home}
    if q.args.kind == "quorum":  # its members (the leader first) and the leader's epoch
        record["members"] = list(q.members or [q.home])
        record["epoch"] = max(q.epoch, 1)
    return record


def _apply_queue(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost = node.vhosts.get(parts[0])
    if vhost is None:
        return
    q = vhost.queues.get(parts[1])
    if rec is None:
        if q is not None:
            vhost.delete_queue(q)
        return
    if q is None or q.home != rec["node"] or "members" in rec:
        node.cluster.place_queue(vhost, rec)


def _kind(dst: Any) -> str:
    return "exchange" if isinstance(dst, Exchange) else "queue"


def _binding_parts(vhost: str | None, b: Any) -> tuple[str, ...]:
    """(vhost, kind, destination, source, id): a destination's bindings share a prefix, so
    deleting a queue deletes them with one range."""
    src, dst, routing_key, args = b
    ident = hashlib.sha256(
        (routing_key + "\0" + encode_table(args or {}, canonical=True)).encode()
    ).hexdigest()[:24]
    return (str(vhost), _kind(dst), dst.name, src.name, ident)


def _binding_record(vhost: str | None, b: Any) -> Record:
    src, dst, routing_key, args = b
    return {"vhost": vhost, "source": src.name, "destination": dst.name,
            "destination_type": _kind(dst), "routing_key": routing_key,
            "arguments": encode_table(args or {})}


def _apply_binding(node: Node, parts: tuple[str, ...], rec: Record | None) -> None:
    vhost = node.vhosts.get(parts[0])
    if vhost is None:
        return
    src = vhost.exchanges.get(parts[3])
    dst: Any = (vhost.queues.get(parts[2]) if parts[1] == "queue"
                else vhost.exchanges.get(parts[2]))
    if src is None or dst is None:
        return
    if rec is None:
        for b in list(src.bindings()):
            args = b.arguments_dict()
            if b.destination is dst and _binding_parts(
                    parts[0], (src, dst, b.routing_key, args)) == parts:
                if isinstance(dst, Exchange):
                    vhost.unbind_exchange(dst.name, src.name, b.routing_key, args)
                else:
                    vhost.unbind_queue(dst, src.name, b.routing_key, args)
        return
    if isinstance(dst, Exchange):
        vhost.bind_exchange(dst.name, src.name, rec["routing_key"],
                            decode_table(rec["arguments"]))
    else:
        vhost.bind_queue(dst, src.name, rec["routing_key"], decode_table(rec["arguments"]))


def _name(vhost: str | None, obj: Any) -> tuple[str, ...]:
    return (str(vhost), obj.name)


def _permissions(node: Node) -> Iterable[tuple[str | None, Any]]:
    return [(vhost, (user, *perm.patterns())) for (user, vhost), perm in node.users.perms.items()]


def _policies(operator: bool) -> Callable[[Node], Iterable[tuple[str | None, Any]]]:
    def objects(node: Node) -> Iterable[tuple[str | None, Any]]:
        return [(v.name, p) for v in node.vhosts.values()
                for p in (v.params.operator_policies if operator else v.params.policies)]

    return objects


def _exchanges(node: Node) -> Iterable[tuple[str | None, Any]]:
    return [(v.name, ex) for v in node.vhosts.values() for ex in v.exchanges.values()
            if ex.name and not ex.name.startswith("amq.")]


def _queues(node: Node) -> Iterable[tuple[str | None, Any]]:
    return [(v.name, q) for v in node.vhosts.values() for q in v.queues.values()]


def _bindings(node: Node) -> Iterable[tuple[str | None, Any]]:
    return [(v.name, (ex, b.destination, b.routing_key, b.arguments_dict()))
            for v in node.vhosts.values() for ex in v.exchanges.values() if ex.name
            for b in ex.bindings()]


FAMILIES: tuple[Family, ...] = (
    Family("vhosts", "put_vhost", "delete_vhost", lambda v, name: (name,),
           lambda v, name: {"name": name}, _apply_vhost, 0,
           lambda node: [(None, name) for name in node.vhosts]),
    Family("users", "put_user", "delete_user", lambda v, u: (u.name,),
           lambda v, u: {"name": u.name, "password_hash": u.password_hash,
                         "tags": list(u.tags)}, _apply_user, 1,
           lambda node: [(None, u) for u in node.users.users.values()]),
    Family("permissions", "put_permission", "delete_permission",
           lambda v, p: (str(v), p[0]),
           lambda v, p: {"vhost": v, "user": p[0], "configure": p[1], "write": p[2],
                         "read": p[3]}, _apply_permission, 2, _permissions),
    Family("topic_permissions", "put_topic_permission", "delete_topic_permission",
           lambda v, p: (str(v), p[0], p[1]),
           lambda v, p: {"vhost": v, "user": p[0], "exchange": p[1], "write": p[2],
                         "read": p[3]}, _apply_topic_permission, 2, _topic_permissions),
    Family("user_limits", "put_user_limit", "delete_user_limit", lambda v, x: (x[0], x[1]),
           lambda v, x: {"user": x[0], "name": x[1], "value": x[2]}, _apply_user_limit, 2,
           lambda node: [(None, (u.name, name, value)) for u in node.users.users.values()
                         for name, value in u.limits.items()]),
    Family("vhost_limits", "put_limits", "delete_limits", lambda v, limits: (str(v),),
           lambda v, limits: {"vhost": v, "value": dict(limits)}, _apply_limits, 3,
           lambda node: [(v.name, v.params.limits) for v in node.vhosts.values()
                         if v.params.limits]),
    Family("operator_policies", "put_operator_policy", "delete_operator_policy", _name,
           _policy_record, _apply_policy(True), 4, _policies(True)),
    Family("policies", "put_policy", "delete_policy", _name, _policy_record,
           _apply_policy(False), 5, _policies(False)),
    Family("parameters", "put_parameter", "delete_parameter", _parameter_key,
           _parameter_record, _apply_parameter, 5, _parameters),
    Family("exchanges", "put_exchange", "delete_exchange", _name, _exchange_record,
           _apply_exchange, 6, _exchanges),
    Family("queues", "put_queue", "delete_queue", _name, _queue_record, _apply_queue, 7,
           _queues),
    Family("bindings", "put_binding", "delete_binding", _binding_parts, _binding_record,
           _apply_binding, 8, _bindings),
)

_BY_EVENT: dict[str, tuple[Family, bool]] = {
    **{f.put_event: (f, True) for f in FAMILIES},
    **{f.delete_event: (f, False) for f in FAMILIES},
}
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}


def family_of_event(what: str) -> tuple[Family, bool] | None:
    """The family storing a change event, and whether it is a put (else a deletion)."""
    return _BY_EVENT.get(what)
