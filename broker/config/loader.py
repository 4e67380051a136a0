"""Loading Settings: defaults <- TOML file <- HARE_* environment <- command-line flags.

Every problem becomes one ConfigError line naming the key and where it came from, so the CLI
can print it and exit 2 instead of showing a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from broker.config.settings import ENV_PREFIX, Settings, env_name, flag_name, key_info

__all__ = [
    "CONFIG_ENV",
    "OTHER_TOOLS_ENV",
    "OTHER_TOOLS_ENV_PREFIXES",
    "ConfigError",
    "build_arg_parser",
    "load_settings",
]

CONFIG_ENV = ENV_PREFIX + "CONFIG"  # path of the TOML file when --config is not given
# HARE_* variables of the other Hare tools, which share the broker's environment (a shell, a
# container). Any other unknown HARE_* variable is taken for a misspelt setting.
# HARE_PURE_PYTHON: read when broker is imported, not a setting (broker/compiled.py).
OTHER_TOOLS_ENV = frozenset({CONFIG_ENV, "HARE_MANAGEMENT_URL", "HARE_PURE_PYTHON"})
# HARE_COMPOSE_*: what docker/compose.yaml reads from the shell that runs compose.
OTHER_TOOLS_ENV_PREFIXES = ("HARE_CTL_", "HARE_PERF_", "HARE_TEST_", "HARE_COMPOSE_")


class ConfigError(Exception):
    """A configuration problem, as one line fit to print before exiting with status 2."""


class _Parser(argparse.ArgumentParser):
    # argparse would print usage and exit; a bad flag is a config error like any other.
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"command line: {message}")


def _suggest(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _shown_default(f: dataclasses.Field[Any]) -> str:
    if f.metadata["secret"]:
        return "set"
    value = f.default
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value) or "none"
    return repr(value) if value == "" else str(value)


def build_arg_parser(prog: str = "hare-server") -> argparse.ArgumentParser:
    """The flags of hare-server: --config plus one --<key> per key that is not file-only."""
    parser = _Parser(
        prog=prog,
        description="Hare, an AMQP 0-9-1 message broker. Settings come from defaults, then "
        f"the TOML file (--config or {CONFIG_ENV}), then HARE_* variables, then these flags.",
        allow_abbrev=False,  # --po must not quietly mean --port
        argument_default=argparse.SUPPRESS,  # absent flags leave the key to env and file
    )
    parser.add_argument("--config", metavar="PATH", help=f"TOML settings file [env {CONFIG_ENV}]")
    for name, f in key_info().items():
        if f.metadata["file_only"]:
            continue
        parser.add_argument(
            flag_name(name),
            dest=name,
            metavar=name.upper(),
            help=f"{f.metadata['help']} [env {env_name(name)}; default {_shown_default(f)}]",
        )
    return parser


def _parse_flags(argv: list[str]) -> dict[str, Any]:
    parser = build_arg_parser()
    namespace, extra = parser.parse_known_args(argv)
    if extra:
        known = [flag for action in parser._actions for flag in action.option_strings]
        word = extra[0].split("=", 1)[0]
        if word.startswith("-"):
            raise ConfigError(f"flag {word}: unknown{_suggest(word, known)}")
        raise ConfigError(f"command line: unexpected argument {word!r}")
    return vars(namespace)


def _parse(name: str, raw: object, from_text: bool, where: str) -> Any:
    try:
        return key_info()[name].metadata["parse"](raw, from_text)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _from_file(path: Path) -> dict[str, tuple[Any, str]]:
    try:
        with path.open("rb") as fh:
            document = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    keys = key_info()
    found: dict[str, tuple[Any, str]] = {}
    for name, raw in document.items():
        if name not in keys:
            hint = _suggest(name, list(keys))
            if isinstance(raw, dict):
                hint += "; keys are flat, write them at the top level without [sections]"
            raise ConfigError(f"config file {path}: unknown key {name!r}{hint}")
        where = f"config file {path}: {name}"
        found[name] = (_parse(name, raw, False, where), where)
    return found


def _from_env(env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    keys = key_info()
    by_var = {env_name(name): name for name, f in keys.items()}
    found: dict[str, tuple[Any, str]] = {}
    for var in sorted(env):
        name = by_var.get(var)
        if name is None and (
            not var.startswith(ENV_PREFIX)
            or var in OTHER_TOOLS_ENV
            or var.startswith(OTHER_TOOLS_ENV_PREFIXES)
        ):
            continue
        where = f"environment variable {var}"
        if name is None:
            hint = _suggest(var, [*by_var, CONFIG_ENV])
            raise ConfigError(f"{where}: not a Hare setting{hint}")
        if keys[name].metadata["file_only"]:
            raise ConfigError(f"{where}: {name} can only be set in the config file")
        found[name] = (_parse(name, env[var], True, where), where)
    return found


def _from_flags(flags: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    found: dict[str, tuple[Any, str]] = {}
    for name, raw in flags.items():
        where = f"flag {flag_name(name)}"
        found[name] = (_parse(name, raw, True, where), where)
    return found


def _check_together(values: dict[str, Any], origin: dict[str, str]) -> None:
    """Rules that span keys; the message names where each side was set."""

    def said(name: str) -> str:
        return f"{name} ({origin.get(name, 'default')})"

    if values["credit_flow_more_credit_after"] > values["credit_flow_initial_credit"]:
        raise ConfigError(
            f"{said('credit_flow_more_credit_after')} must not exceed "
            f"{said('credit_flow_initial_credit')}"
        )
    if values["cluster_etcd"] and not values["cluster_secret"]:
        raise ConfigError(
            f"{said('cluster_etcd')} is set: the nodes need a shared cluster_secret "
            "(HARE_CLUSTER_SECRET) to authenticate their links"
        )
    for prefix in ("ssl", "management_ssl"):
        _check_tls(prefix, values, said)
    if "EXTERNAL" in values["auth_mechanisms"] and (
        values["ssl_certfile"] is None or values["ssl_verify"] != "verify_peer"
    ):
        raise ConfigError(
            f"{said('auth_mechanisms')}: EXTERNAL needs the AMQPS listener with client "
            "certificates: set ssl_certfile, ssl_cacertfile and ssl_verify = \"verify_peer\""
        )
    if "http" in values["auth_backends"]:
        for key in ("auth_http_user_path", "auth_http_vhost_path", "auth_http_resource_path"):
            if not values[key]:
                raise ConfigError(f"{said(key)} must be set when {said('auth_backends')} "
                                  "names http")
    user_names = {values["default_user"], *(user.name for user in values["users"])}
    vhost_names = {values["default_vhost"], *values["vhosts"]}
    for index, permission in enumerate(values["permissions"]):
        where = f"{origin.get('permissions')}: entry {index + 1}"
        if permission.user not in user_names:
            raise ConfigError(f"{where}: user {permission.user!r} is not declared in users")
        if permission.vhost not in vhost_names:
            raise ConfigError(f"{where}: vhost {permission.vhost!r} is not declared in vhosts")


def _check_tls(prefix: str, values: dict[str, Any], said: Callable[[str], str]) -> None:
    """A listener's TLS keys must make sense together (whether the files exist and hold
    certificates is checked when the broker starts: they are read there)."""
    certfile = f"{prefix}_certfile"
    if values[certfile] is None:
        for key in ("keyfile", "cacertfile"):
            if values[f"{prefix}_{key}"] is not None:
                raise ConfigError(f"{said(f'{prefix}_{key}')} is set but {said(certfile)} is not")
        return
    if values[f"{prefix}_verify"] == "verify_peer" and values[f"{prefix}_cacertfile"] is None:
        raise ConfigError(
            f"{said(f'{prefix}_verify')} is verify_peer: it needs {said(f'{prefix}_cacertfile')}"
        )
    if values[f"{prefix}_fail_if_no_peer_cert"] and values[f"{prefix}_verify"] != "verify_peer":
        raise ConfigError(
            f"{said(f'{prefix}_fail_if_no_peer_cert')} needs {prefix}_verify = verify_peer, "
            f"but {said(f'{prefix}_verify')} is {values[f'{prefix}_verify']}"
        )


def load_settings(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from the file, environment and flags; raise ConfigError on any problem.

    `argv` defaults to sys.argv[1:] and `env` to os.environ; pass them to load in isolation.
    `--help` prints the flags and raises SystemExit(0), as argparse does.
    """
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if env is None else env
    flags = _parse_flags(argv)
    config_path = flags.pop("config", None) or env.get(CONFIG_ENV) or None

    layers: list[dict[str, tuple[Any, str]]] = []
    if config_path is not None:
        layers.append(_from_file(Path(config_path).expanduser()))
    layers += [_from_env(env), _from_flags(flags)]

    values = {name: f.default for name, f in key_info().items()}
    origin: dict[str, str] = {}
    for layer in layers:  # later layers win
        for name, (value, where) in layer.items():
            values[name] = value
            origin[name] = where
    _check_together(values, origin)
    return Settings(**values)
