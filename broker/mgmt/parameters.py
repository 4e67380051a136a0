"""/api/parameters/{component} and /api/shovels: RabbitMQ's paths for the runtime parameters
of components a plugin owns (the shovel plugin: broker/shovel). The component is found in
`Node.parameter_components` at request time, so this module names no plugin; a component
nobody registered is 404, as RabbitMQ answers for a plugin that is not enabled.

Who may: reading needs the management tag and the vhost; setting needs policymaker, as
RabbitMQ's parameters do. Static shovels (from the config file) belong to no vhost: as in
rabbitmq_shovel_management, only administrators see them, only in the unfiltered list, and
neither delete path finds them (404)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

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
from broker.mgmt.peers import all_status

if TYPE_CHECKING:
    from broker.node.plugin import ParameterComponent

__all__ = ["add_routes"]

SHOVEL = "shovel"


def _component(request: web.Request, name: str | None = None) -> ParameterComponent:
    component = request.app[NODE].parameter_components.get(
        name or request.match_info["component"])
    if component is None:
        raise ApiError(404, "Not Found")
    return component


async def federation_links(request: web.Request) -> web.Response:
    """/api/federation-links[/{vhost}]: the federation plugin's links (broker/federation),
    which its `federation-upstream` component's status() lists."""
    vhosts = await _visible(request)
    _component(request, "federation-upstream")  # 404 when the plugin is not there
    rows = await all_status(request.app[NODE], "federation-upstream")
    return json_response([s for s in rows if s["vhost"] in vhosts])


async def _visible(request: web.Request) -> set[str]:
    wanted = request.match_info.get("vhost")
    if wanted is not None:
        return {vhost_of(request.app[NODE], wanted).name}
    return {v.name for v in await visible_vhosts(request)}


async def parameters_list(request: web.Request) -> web.Response:
    vhosts = await _visible(request)
    return json_response([p for p in _component(request).parameters() if p["vhost"] in vhosts])


async def parameter_one(request: web.Request) -> web.Response:
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    for p in _component(request).parameters():
        if p["vhost"] == vhost and p["name"] == name:
            return json_response(p)
    raise ApiError(404, "Not Found")


async def parameter_put(request: web.Request) -> web.Response:
    component = _component(request)
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    body = await read_json(request)
    if "value" not in body:
        raise ApiError(400, "[{key_missing,value}]")
    try:
        created = component.put(vhost.name, request.match_info["name"], body["value"],
                                caller(request).principal.name)
    except ValueError as exc:  # the component's reason
        raise ApiError(400, str(exc)) from None
    return created_or_updated(created)


async def parameter_delete(request: web.Request) -> web.Response:
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    if not _component(request).delete(vhost.name, request.match_info["name"]):
        raise ApiError(404, "Not Found")
    return no_content()


async def shovels_list(request: web.Request) -> web.Response:
    vhosts = await _visible(request)
    static_too = "vhost" not in request.match_info and caller(request).is_admin
    _component(request, SHOVEL)  # 404 when the plugin is not there
    rows = await all_status(request.app[NODE], SHOVEL)
    return json_response([s for s in rows if s.get("vhost", None) in vhosts
                          or ("vhost" not in s and static_too)])


async def shovel_delete(request: web.Request) -> web.Response:
    """DELETE /api/shovels/vhost/{vhost}/{name}: the management plugin's other way to delete
    a dynamic shovel (its parameter goes with it)."""
    vhost = vhost_of(request.app[NODE], request.match_info["vhost"])
    if not _component(request, SHOVEL).delete(vhost.name, request.match_info["name"]):
        raise ApiError(404, "Not Found")
    return no_content()


def add_routes(app: web.Application) -> None:
    m, p = Need.MANAGEMENT, Need.POLICYMAKER
    base = "/api/parameters/{component}"
    add_route(app, "GET", "/api/federation-links", federation_links, m)
    add_route(app, "GET", "/api/federation-links/{vhost}", federation_links, m)
    add_route(app, "GET", base, parameters_list, m)
    add_route(app, "GET", base + "/{vhost}", parameters_list, m)
    add_route(app, "GET", base + "/{vhost}/{name}", parameter_one, m)
    add_route(app, "PUT", base + "/{vhost}/{name}", parameter_put, p)
    add_route(app, "DELETE", base + "/{vhost}/{name}", parameter_delete, p)
    add_route(app, "GET", "/api/shovels", shovels_list, m)
    add_route(app, "GET", "/api/shovels/{vhost}", shovels_list, m)
    add_route(app, "DELETE", "/api/shovels/vhost/{vhost}/{name}", shovel_delete, p)
