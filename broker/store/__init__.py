"""Message stores (persistent and transient bodies), queue index and definitions database."""

from broker.store.msg_store import MessageUnreadable, MsgStore, StoreClient
from broker.store.msg_store_recovery import RecoveryReport
from broker.store.verify import VerifyReport, verify

__all__ = [
    "MessageUnreadable",
    "MsgStore",
    "RecoveryReport",
    "StoreClient",
    "VerifyReport",
    "verify",
]
