"""/api/definitions: export and import in RabbitMQ's definitions JSON, so a RabbitMQ export
loads into Hare and a Hare export loads into RabbitMQ.

As RabbitMQ, only durable queues and exchanges are exported (transient ones are not topology
to restore), never the amq.* and default exchanges, nor the implicit default-exchange
bindings. Policies are in `policies`; operator policies and vhost limits are in `parameters`
(components `operator_policy` and `vhost-limits`), as RabbitMQ exports them, with those of
the components plugins register (`shovel`: Node.parameter_components). Import applies
vhosts, users (with their limits), permissions, topic permissions, limits, operator policies,
policies, exchanges, queues, then bindings (policies before the queues they apply to); the
first bad item stops it with a 400 naming that item (what came before it stays applied, as
RabbitMQ). What Hare has no notion of (other parameter components, global parameters) is
ignored and counted in the log. Administrators only, both ways: an import creates users and
grants permissions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from broker import __version__
from broker.mgmt.admin import permission_json, put_user, set_permission, user_json
from broker.mgmt.authz import Need, add_route
from broker.mgmt.http import NODE, ApiError, json_response, no_content, read_json
from broker.mgmt.policies import prefetch_policy_checks, set_limits, set_policy
from broker.mgmt.topic_permissions import set_topic_permission, topic_permission_rows
from broker.mgmt.user_limits import set_user_limit
from broker.protocol.errors import AMQPError
from broker.routing.exchange import Exchange

if TYPE_CHECKING:
    from broker.access import Principal
    from broker.node import Node

__all__ = ["add_routes", "export_definitions", "import_definitions"]

log = structlog.get_logger("hare.mgmt")

_IGNORED = ("global_parameters",)
_OPERATOR_POLICY = "operator_policy"  # RabbitMQ's parameter components
_VHOST_LIMITS = "vhost-limits"


def _builtin(name: str) -> bool:
    return name == "" or name.startswith("amq.")


def export_definitions(node: Node) -> dict[str, Any]:
    queues: list[dict[str, Any]] = []
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    for vname in sorted(node.vhosts):
        vhost = node.vhosts[vname]
        exported_q = {name for name, q in vhost.queues.items()
                      if q.durable and q.exclusive_owner is None}
        for name in sorted(exported_q):
            q = vhost.queues[name]
            queues.append({"name": name, "vhost": vname, "durable": True,
                           "auto_delete": q.auto_delete, "arguments": q.arguments})
        for name in sorted(vhost.exchanges):
            ex = vhost.exchanges[name]
            if ex.durable and not _builtin(name):
                exchanges.append({"name": name, "vhost": vname, "type": ex.type,
                                  "durable": True, "auto_delete": ex.auto_delete,
                                  "internal": ex.internal, "arguments": ex.arguments})
        for name in sorted(vhost.exchanges):
            ex = vhost.exchanges[name]
            if name == "" or not ex.durable:
                continue
            for b in ex.bindings():
                dest = b.destination
                if isinstance(dest, Exchange):
                    if not dest.durable:
                        continue
                    dest_name, kind = dest.name, "exchange"
                else:
                    dest_name, kind = str(getattr(dest, "name", "")), "queue"
                    if dest_name not in exported_q:
                        continue
                bindings.append({"source": name, "vhost": vname, "destination": dest_name,
                                 "destination_type": kind, "routing_key": b.routing_key,
                                 "arguments": b.arguments_dict()})
    policies: list[dict[str, Any]] = []
    parameters: list[dict[str, Any]] = []
    for vname in sorted(node.vhosts):
        params = node.vhosts[vname].params
        policies.extend(p.json() for p in params.policies)
        parameters.extend({"value": p.body(), "vhost": vname, "component": _OPERATOR_POLICY,
                           "name": p.name} for p in params.operator_policies)
        if params.limits:
            parameters.append({"value": dict(params.limits), "vhost": vname,
                               "component": _VHOST_LIMITS, "name": "limits"})
    for component in node.parameter_components.values():  # plugins' (shovels)
        parameters.extend(component.parameters())
    return {
        "rabbit_version": __version__,
        "rabbitmq_version": __version__,
        "product_name": "Hare",
        "product_version": __version__,
        "users": [user_json(u) for _, u in sorted(node.users.users.items())],
        "vhosts": [{"name": name, "limits": [], "metadata": {"description": "", "tags": []}}
                   for name in sorted(node.vhosts)],
        "permissions": [permission_json(node, user, vhost)
                        for user, vhost in sorted(node.users.perms)],
        "topic_permissions": topic_permission_rows(node),
        "parameters": parameters,
        "global_parameters": [],
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def _items(defs: dict[str, Any], section: str) -> list[dict[str, Any]]:
    items = defs.get(section) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ApiError(400, f"'{section}' must be a list of objects")
    return items


def _str(item: dict[str, Any], key: str, section: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"{section}: {key} missing or not a string in {item!r}")
    return value


def _vhost(node: Node, item: dict[str, Any], section: str) -> Any:
    name = _str(item, "vhost", section)
    vhost = node.vhosts.get(name)
    if vhost is None:
        raise ApiError(400, f"{section}: vhost '{name}' does not exist (item {item!r})")
    return vhost


def import_definitions(node: Node, defs: dict[str, Any],
                       user: Principal | None = None) -> dict[str, int]:
    """Apply a definitions document; returns how many items of each section were applied.
    `user` is who imports it (policies are validated for that user)."""
    done: dict[str, int] = {}
    for item in _items(defs, "vhosts"):
        node.add_vhost(_str(item, "name", "vhosts"))
    done["vhosts"] = len(_items(defs, "vhosts"))
    for item in _items(defs, "users"):
        fields = ("password", "password_hash", "hashing_algorithm", "tags")
        body: dict[str, Any] = {k: item[k] for k in fields if k in item}
        if "password" not in body and "password_hash" not in body:
            body["password_hash"] = ""
        name = _str(item, "name", "users")
        put_user(node, name, body)
        limits = item.get("limits") or {}
        if not isinstance(limits, dict):
            raise ApiError(400, f"users: limits of {name!r} must be an object")
        for limit, value in limits.items():
            set_user_limit(node, name, limit, value)
    done["users"] = len(_items(defs, "users"))
    for item in _items(defs, "permissions"):
        set_permission(node, _str(item, "user", "permissions"),
                       _str(item, "vhost", "permissions"), item)
    done["permissions"] = len(_items(defs, "permissions"))
    for item in _items(defs, "topic_permissions"):
        set_topic_permission(node, _str(item, "user", "topic_permissions"),
                             _str(item, "vhost", "topic_permissions"), item)
    done["topic_permissions"] = len(_items(defs, "topic_permissions"))
    ignored: dict[str, int] = {}
    for item in _items(defs, "parameters"):
        component = item.get("component")
        value = item.get("value")
        plugin = node.parameter_components.get(component) if isinstance(component, str) else None
        if plugin is not None:
            vhost = _vhost(node, item, "parameters")
            try:
                plugin.put(vhost.name, _str(item, "name", "parameters"), value,
                           user.name if user is not None else None)
            except ValueError as exc:  # the component's reason
                raise ApiError(400, f"parameters: {exc}") from None
            done[component] = done.get(component, 0) + 1
            continue
        if component not in (_OPERATOR_POLICY, _VHOST_LIMITS):
            ignored[f"parameters:{component}"] = ignored.get(f"parameters:{component}", 0) + 1
            continue
        if not isinstance(value, dict):
            raise ApiError(400, f"parameters: value must be an object in {item!r}")
        vhost = _vhost(node, item, "parameters")
        if component == _VHOST_LIMITS:
            set_limits(vhost, value)
        else:
            set_policy(node, vhost, _str(item, "name", "parameters"), value, operator=True,
                       user=user)
        done[component] = done.get(component, 0) + 1
    for item in _items(defs, "policies"):
        body = {k: item[k] for k in ("pattern", "definition", "priority", "apply-to")
                if k in item}
        set_policy(node, _vhost(node, item, "policies"), _str(item, "name", "policies"), body,
                   operator=False, user=user)
    done["policies"] = len(_items(defs, "policies"))
    try:
        for item in _items(defs, "exchanges"):
            name = _str(item, "name", "exchanges")
            if _builtin(name):
                continue
            _vhost(node, item, "exchanges").declare_exchange(
                name, _str(item, "type", "exchanges"),
                durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)),
                internal=bool(item.get("internal", False)),
                arguments=item.get("arguments") or {},
            )
        done["exchanges"] = len(_items(defs, "exchanges"))
        for item in _items(defs, "queues"):
            _vhost(node, item, "queues").declare_queue(
                _str(item, "name", "queues"),
                durable=bool(item.get("durable", True)),
                auto_delete=bool(item.get("auto_delete", False)),
                arguments=item.get("arguments") or {},
            )
        done["queues"] = len(_items(defs, "queues"))
        for item in _items(defs, "bindings"):
            vhost = _vhost(node, item, "bindings")
            source = _str(item, "source", "bindings")
            if source == "":
                continue  # implicit default-exchange binding: exists with the queue
            dest = _str(item, "destination", "bindings")
            key = item.get("routing_key") or ""
            args = item.get("arguments") or {}
            if item.get("destination_type", "queue") == "queue":
                vhost.bind_queue(vhost.queue(dest), source, key, args)
            else:
                vhost.bind_exchange(dest, source, key, args)
        done["bindings"] = len(_items(defs, "bindings"))
    except AMQPError as exc:
        raise ApiError(400, f"definitions import failed: {exc.text}") from exc
    ignored.update({s: len(defs[s]) for s in _IGNORED
                    if isinstance(defs.get(s), list) and defs[s]})
    log.info("definitions imported", **done, ignored=ignored or None)
    return done


async def definitions_get(request: web.Request) -> web.Response:
    resp = json_response(export_definitions(request.app[NODE]))
    if request.query.get("download"):
        name = request.query["download"].replace('"', "")
        resp.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return resp


async def definitions_post(request: web.Request) -> web.Response:
    defs = await read_json(request)
    for item in _items(defs, "policies"):  # the import's policy checks, asked beforehand
        vhost = item.get("vhost")
        if isinstance(vhost, str):
            await prefetch_policy_checks(request, vhost, item.get("definition"))
    import_definitions(request.app[NODE], defs, request.get("user"))
    return no_content()


def add_routes(app: web.Application) -> None:
    add_route(app, "GET", "/api/definitions", definitions_get, Need.ADMINISTRATOR)
    add_route(app, "POST", "/api/definitions", definitions_post, Need.ADMINISTRATOR)
