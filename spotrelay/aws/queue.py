"""`JobQueue` on SQS: the job queue and its dead-letter queue."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from spotrelay.control.ports import QueueMessage

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageAttributeValueTypeDef

logger = logging.getLogger(__name__)

ERROR_ATTRIBUTE = "spotrelay-error"
SUBMISSION_ATTRIBUTE = "spotrelay-submission-id"  # sent by `spotrelay submit` (spotrelay/aws/deployed_stack.py)
MAX_MESSAGE_BYTES = 262_144  # body + attribute names, types and values (the classic SQS limit)
MAX_REASON_BYTES = 4_096  # enough to say what was wrong; the rest is in the logs
MAX_RECEIVE_PER_CALL = 10
# Characters SQS accepts in a body or a string attribute (XML 1.0): others become U+FFFD.
_NOT_ALLOWED = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def attribute_text(reason: str, budget_bytes: int) -> str:
    """`reason` as a valid attribute value of at most `budget_bytes` UTF-8 bytes (cut at a character)."""
    clean = _NOT_ALLOWED.sub("\ufffd", reason) or "(no reason given)"
    encoded = clean.encode("utf-8")
    if len(encoded) <= budget_bytes:
        return clean
    marker = "…"
    room = max(0, budget_bytes - len(marker.encode("utf-8")))
    return encoded[:room].decode("utf-8", errors="ignore") + marker


class SqsJobQueue:
    def __init__(self, client: SQSClient, queue_url: str, dlq_url: str) -> None:
        self.client = client
        self.queue_url = queue_url
        self.dlq_url = dlq_url

    def receive(self, max_messages: int) -> list[QueueMessage]:
        """Up to `max_messages` messages, without waiting: short polls until the queue answers empty."""
        received: dict[str, QueueMessage] = {}
        while len(received) < max_messages:
            response = self.client.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(MAX_RECEIVE_PER_CALL, max_messages - len(received)),
                WaitTimeSeconds=0,
                MessageAttributeNames=[SUBMISSION_ATTRIBUTE],
            )
            before = len(received)
            for m in response.get("Messages", []):
                if "MessageId" in m and "ReceiptHandle" in m:
                    attribute = m.get("MessageAttributes", {}).get(SUBMISSION_ATTRIBUTE)
                    submission = attribute.get("StringValue") if attribute is not None else None
                    received[m["MessageId"]] = QueueMessage(
                        message_id=m["MessageId"],
                        receipt_handle=m["ReceiptHandle"],
                        body=m.get("Body", ""),
                        submission_id=submission,
                    )
            if len(received) == before:  # empty, or only messages seen already (a zero visibility timeout)
                break
        return list(received.values())

    def delete(self, message: QueueMessage) -> None:
        self.client.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message.receipt_handle)

    def dead_letter(self, message: QueueMessage, reason: str) -> None:
        overhead = len(message.body.encode("utf-8")) + len(ERROR_ATTRIBUTE) + len("String")
        budget = min(MAX_REASON_BYTES, MAX_MESSAGE_BYTES - overhead)
        attributes: dict[str, MessageAttributeValueTypeDef] = {}
        if budget > 0:
            attributes[ERROR_ATTRIBUTE] = {"DataType": "String", "StringValue": attribute_text(reason, budget)}
        else:
            logger.warning(
                "message too large to carry its error reason into the DLQ",
                extra={"message_id": message.message_id, "reason": reason[:MAX_REASON_BYTES]},
            )
        self.client.send_message(QueueUrl=self.dlq_url, MessageBody=message.body, MessageAttributes=attributes)
        self.delete(message)
