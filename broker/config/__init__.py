"""The settings model and its loading (file, environment, flags).

    settings = load_settings()          # defaults <- --config TOML <- HARE_* <- flags

Everything a broker part needs to know about configuration is imported from here.
"""

from broker.config.loader import CONFIG_ENV, ConfigError, build_arg_parser, load_settings
from broker.config.passwords import check_password, hash_password, is_password_hash
from broker.config.settings import Settings, env_name, flag_name
from broker.config.sizes import parse_size
from broker.config.values import (
    CertLoginFrom,
    Fsync,
    LogFormat,
    MemoryWatermark,
    PermissionSpec,
    ShovelSpec,
    SslVerify,
    TlsVersion,
    Unroutable,
    UserSpec,
)

__all__ = [
    "CONFIG_ENV",
    "CertLoginFrom",
    "ConfigError",
    "Fsync",
    "LogFormat",
    "MemoryWatermark",
    "PermissionSpec",
    "Settings",
    "ShovelSpec",
    "SslVerify",
    "TlsVersion",
    "Unroutable",
    "UserSpec",
    "build_arg_parser",
    "check_password",
    "env_name",
    "flag_name",
    "hash_password",
    "is_password_hash",
    "load_settings",
    "parse_size",
]
