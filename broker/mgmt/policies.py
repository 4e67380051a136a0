"""/api/policies, /api/operator-policies and /api/vhost-limits: RabbitMQ's paths, JSON and
status codes. A policy set here is validated, stored in the vhost (which applies it to its
queues and exchanges at once) and written to the definitions database.

Who may: policies are read by any management tag in its own vhosts and set by policymakers
(and administrators); operator policies and vhost limits are set by administrators only. A
policy that names a dead-letter or alternate exchange also needs write on that exchange from
whoever sets it (docs/SECURITY.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.access import AccessRefused
from broker.mgmt.api import vhost_of
from broker.mgmt.authz import Need, add_route, caller, visible_vhosts
from broker.mgmt.http import (
    NODE,
    ApiError,
    created_or_updated,
    json_response,
    no_content,
    read_json,
)
from broker.policy import Policy, PolicyInvalid, parse_limits, parse_policy

if TYPE_CHECKING:
    from broker.access import Principal
    from broker.node import Node
    from broker.vhost import VHost

__all__ = [
    "add_routes",
    "limits_json",
    "prefetch_policy_checks",
    "set_limits",
    "set_policy",
    "validate_policy",
]


def validate_policy(node: Node, vhost: VHost, name: str, body: dict[str, Any], *,
                    operator: bool, user: Principal | None) -> Policy:
    """Every policy passes here before it is stored: PUT over HTTP and definitions import.

    Whoever sets it needs the permissions its effect needs: write on the dead-letter and
    alternate exchanges it names (401 with the AMQP reason otherwise), so no path can store a
    policy around the check. `user` None: the broker itself (restoring at start)."""
    try:
        policy = parse_policy(vhost.name, name, body, operator=operator)
    except PolicyInvalid as exc:
        raise ApiError(400, exc.reason) from exc
    if user is not None:
        try:
            node.auth.check_policy_definition(user, vhost.name, policy.definition)
        except AccessRefused as exc:
            raise ApiError(401, exc.reply_text) from None
    return policy


async def prefetch_policy_checks(request: web.Request, vhost: str,
                                 definition: object) -> None:
    """Ask a network auth backend what `validate_policy` will check, so its synchronous
    check finds the answer cached (the internal backend answers at once anyway)."""
    if isinstance(definition, dict):
        auth = request.app[NODE].auth
        try:
            await auth.settle(auth.check_policy_definition, caller(request).principal, vhost,
                              definition)
        except AccessRefused:
            pass  # validate_policy refuses it with the full answer


def set_policy(node: Node, vhost: VHost, name: str, body: dict[str, Any], *,
               operator: bool, user: Principal | None) -> bool:
    """Validate, store and apply; True when the policy is new."""
    policy = validate_policy(node, vhost, name, body, operator=operator, user=user)
    return vhost.params.put_policy(policy)


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


def _policies(vhost: VHost, operator: bool) -> list[Policy]:
    return list(vhost.params.operator_policies if operator else vhost.params.policies)


async def policies_list(request: web.Request) -> web.Response:
    vhosts = sorted(await visible_vhosts(request), key=lambda v: v.name)
    operator = _operator(request)
    return json_response([p.json() for v in vhosts for p in _policies(v, operator)])


def _policy(request: web.Request) -> Policy:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    sets = vhost.params.operator_policies if _operator(request) else vhost.params.policies
    policy = sets.get(request.match_info["name"])
    if policy is None:
        raise ApiError(404, "Not Found")
    return policy


async def policy_one(request: web.Request) -> web.Response:
    return json_response(_policy(request).json())


async def policy_put(request: web.Request) -> web.Response:
    node = request.app[NODE]
    vhost = vhost_of(node, request.match_info["vhost"])
    body = await read_json(request)
    await prefetch_policy_checks(request, vhost.name, body.get("definition"))
    created = set_policy(node, vhost, request.match_info["name"], body,
                         operator=_operator(request), user=request.get("user"))
    return created_or_updated(created)


async def policy_delete(request: web.Request) -> web.Response:
    policy = _policy(request)
    vhost = vhost_of(request.app[NODE], policy.vhost)
    vhost.params.clear_policy(policy.name, policy.operator)
    return no_content()


# -- vhost limits -------------------------------------------------------------------------------
def limits_json(vhost: VHost) -> list[dict[str, Any]]:
    """RabbitMQ's shape: one {"vhost", "value"} object, or nothing when no limit is set."""
    limits = vhost.params.limits
    return [{"vhost": vhost.name, "value": dict(limits)}] if limits else []


def set_limits(vhost: VHost, value: dict[str, Any]) -> None:
    """Replace every limit of the vhost (rabbitmqctl set_vhost_limits semantics)."""
    try:
        vhost.params.set_limits(parse_limits(value))
    except PolicyInvalid as exc:
        raise ApiError(400, exc.reason) from exc


async def limits_list(request: web.Request) -> web.Response:
    vhosts = sorted(await visible_vhosts(request, monitor_sees_all=True), key=lambda v: v.name)
    return json_response([x for v in vhosts for x in limits_json(v)])


async def limit_put(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    body = await read_json(request)
    if "value" not in body:
        raise ApiError(400, "[{key_missing,value}]")
    set_limits(vhost, {**vhost.params.limits, request.match_info["name"]: body["value"]})
    return no_content()


async def limit_delete(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    limits = dict(vhost.params.limits)
    if limits.pop(request.match_info["name"], None) is not None:
        vhost.params.set_limits(limits)
    return no_content()  # as RabbitMQ, also when that limit was not set


def add_routes(app: web.Application) -> None:
    m = Need.MANAGEMENT
    for base, setter in (("/api/policies", Need.POLICYMAKER),
                         ("/api/operator-policies", Need.ADMINISTRATOR)):
        add_route(app, "GET", base, policies_list, m)
        add_route(app, "GET", base + "/{vhost}", policies_list, m)
        add_route(app, "GET", base + "/{vhost}/{name}", policy_one, m)
        add_route(app, "PUT", base + "/{vhost}/{name}", policy_put, setter)
        add_route(app, "DELETE", base + "/{vhost}/{name}", policy_delete, setter)
    add_route(app, "GET", "/api/vhost-limits", limits_list, m)
    add_route(app, "GET", "/api/vhost-limits/{vhost}", limits_list, m)
    add_route(app, "PUT", "/api/vhost-limits/{vhost}/{name}", limit_put, Need.ADMINISTRATOR)
    add_route(app, "DELETE", "/api/vhost-limits/{vhost}/{name}", limit_delete,
              Need.ADMINISTRATOR)
