"""Direct reply-to and permissions, as RabbitMQ 3.10.8: consuming amq.rabbitmq.reply-to needs
no permission; a reply is a publish to the default exchange and needs write on amq.default."""

from __future__ import annotations

import pika

from tests.mgmt.helpers import MgmtBroker

from .helpers import connect, make_user, refused


def test_reply_needs_write_on_the_default_exchange(mgmt: MgmtBroker) -> None:
    narrow = make_user(mgmt, "rpc", perms={"/": ("^app", "^app", "^app")})
    requester = connect(mgmt).channel()
    replies: list[bytes] = []
    requester.basic_consume("amq.rabbitmq.reply-to",
                            lambda ch, m, p, body: replies.append(body), auto_ack=True)
    requester.queue_declare("app-rpc-" + narrow, auto_delete=True)
    requester.basic_publish("", "app-rpc-" + narrow, b"req",
                            pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))

    worker = connect(mgmt, narrow).channel()
    # consuming the pseudo-queue itself needs no read permission
    worker.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True)
    _, props, _ = worker.basic_get("app-rpc-" + narrow, auto_ack=True)
    assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
    refused(worker, lambda c: c.basic_publish("", props.reply_to, b"resp"),
            f"access to exchange 'amq.default' in vhost '/' refused for user '{narrow}'")
    requester.connection.process_data_events(0.2)
    assert replies == []
