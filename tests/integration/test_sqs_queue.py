"""SqsJobQueue on moto: receiving in batches, deleting, and dead-lettering with the reason attached."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotrelay.aws.queue import ERROR_ATTRIBUTE, MAX_REASON_BYTES, SqsJobQueue

from .aws_resources import Queues

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef


def messages_left(sqs: SQSClient, queue_url: str) -> int:
    """Visible plus in flight: what the queue still holds."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def dlq_messages(sqs: SQSClient, dlq_url: str) -> list[MessageTypeDef]:
    response = sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
    return response.get("Messages", [])


def test_receive_gathers_up_to_the_limit_across_batches(job_queue: SqsJobQueue, sqs: SQSClient, queues: Queues) -> None:
    # Given 15 submissions waiting
    for n in range(15):
        sqs.send_message(QueueUrl=queues.queue_url, MessageBody=f'{{"n": {n}}}')

    # When 12 are asked for (more than one SQS call can return), then 10 more
    first = job_queue.receive(12)
    rest = job_queue.receive(10)

    # Then 12 distinct messages come, then the 3 left
    assert len(first) == 12
    assert len(rest) == 3
    assert len({m.message_id for m in first + rest}) == 15
    assert sorted(m.body for m in first + rest) == sorted(f'{{"n": {n}}}' for n in range(15))


def test_a_deleted_message_leaves_the_queue(job_queue: SqsJobQueue, sqs: SQSClient, queues: Queues) -> None:
    # Given one received submission
    sqs.send_message(QueueUrl=queues.queue_url, MessageBody="{}")
    (message,) = job_queue.receive(10)

    # When it is deleted / Then the queue holds nothing, in flight or not
    job_queue.delete(message)
    assert messages_left(sqs, queues.queue_url) == 0


def test_a_dead_lettered_message_moves_to_the_dlq_with_its_reason(
    job_queue: SqsJobQueue, sqs: SQSClient, queues: Queues
) -> None:
    # Given a submission that cannot be parsed
    sqs.send_message(QueueUrl=queues.queue_url, MessageBody='{"name": ')
    (message,) = job_queue.receive(1)

    # When it is dead-lettered with the parse error
    job_queue.dead_letter(message, "not JSON: line 1: unexpected end of input")

    # Then the DLQ holds the same body with the reason attached, and the queue holds nothing
    (kept,) = dlq_messages(sqs, queues.dlq_url)
    assert kept.get("Body") == '{"name": '
    assert kept.get("MessageAttributes", {})[ERROR_ATTRIBUTE] == {
        "DataType": "String",
        "StringValue": "not JSON: line 1: unexpected end of input",
    }
    assert messages_left(sqs, queues.queue_url) == 0


def test_a_long_or_unprintable_reason_is_cut_to_a_valid_attribute(
    job_queue: SqsJobQueue, sqs: SQSClient, queues: Queues
) -> None:
    # Given a reason with characters SQS rejects, and far longer than an attribute should be
    sqs.send_message(QueueUrl=queues.queue_url, MessageBody="{}")
    (message,) = job_queue.receive(1)
    reason = "bad byte \x00 then " + "é" * 10_000

    # When the message is dead-lettered
    job_queue.dead_letter(message, reason)

    # Then the reason arrives cut to the limit, marked as cut, without the rejected character
    (kept,) = dlq_messages(sqs, queues.dlq_url)
    text = kept.get("MessageAttributes", {})[ERROR_ATTRIBUTE].get("StringValue", "")
    assert text.startswith("bad byte \ufffd then éé")
    assert text.endswith("…")
    assert len(text.encode("utf-8")) <= MAX_REASON_BYTES
