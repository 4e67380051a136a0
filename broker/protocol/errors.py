"""AMQP exceptions carrying their reply code: a channel error closes the channel, a connection
error closes the connection. Raised by protocol logic, turned into close frames by the server."""

from __future__ import annotations

from broker.protocol.constants import REPLY_TEXT

__all__ = ["AMQPError", "ChannelError", "ConnectionError_", "is_hard_error"]


class AMQPError(Exception):
    """Base: `code` is the AMQP reply code, `text` the reply text, `method` the (class, method)
    ids of the method that failed, (0, 0) when none."""

    def __init__(self, code: int, text: str, method: tuple[int, int] = (0, 0)) -> None:
        self.code = code
        self.text = text
        self.method = method
        super().__init__(f"{code} {text}")

    @property
    def reply_text(self) -> str:
        return f"{REPLY_TEXT.get(self.code, 'ERROR')} - {self.text}"


class ChannelError(AMQPError):
    """A soft error: closes only the channel (channel.close)."""


class ConnectionError_(AMQPError):
    """A hard error: closes the whole connection (connection.close)."""


def is_hard_error(code: int) -> bool:
    """Reply codes the spec classes as connection exceptions."""
    return code in (320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541)
