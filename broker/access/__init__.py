"""Who may log in and what they may do: users and permissions, the auth backends (internal and
HTTP), SASL mechanisms and the checks every AMQP method and management request goes through.
Below the server and mgmt layers: it knows nothing of channels or HTTP handlers."""

from broker.access.backends import Backend, InternalBackend, LoginResult, Principal
from broker.access.certificates import peer_cert_name, rfc4514
from broker.access.control import (
    AccessControl,
    AccessRefused,
    AuthAttempts,
    LoginRefused,
    Pending,
)
from broker.access.mechanisms import Credentials, MechanismError, offered, parse_response
from broker.access.patterns import Permissions, TopicPermission
from broker.access.users import LIMITS, User, UserDB

__all__ = [
    "LIMITS",
    "AccessControl",
    "AccessRefused",
    "AuthAttempts",
    "Backend",
    "Credentials",
    "InternalBackend",
    "LoginRefused",
    "LoginResult",
    "MechanismError",
    "Pending",
    "Permissions",
    "Principal",
    "TopicPermission",
    "User",
    "UserDB",
    "offered",
    "parse_response",
    "peer_cert_name",
    "rfc4514",
]
