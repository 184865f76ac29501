"""The Query, serializer and signing patches (spotrelay.local.patches, "Speed") give the answers stock moto
gives: table and index queries over many partitions, with key conditions, filters, reverse order and
pagination; DescribeInstances; and requests that still reach the account and region they name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotrelay.local import patches

REGION = "eu-west-1"
TABLE = "jobs"
AMI = "ami-12c6146b"  # one of moto's stock images


@contextmanager
def mocked(speed: bool) -> Iterator[None]:
    with mock_aws():
        patcher = patches._Patcher()
        if speed:
            patches._patch_speed(patcher)
        try:
            yield
        finally:
            patcher.undo()


def _table() -> Any:
    resource: Any = boto3.resource("dynamodb", region_name=REGION)
    table = resource.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": kind}
            for name, kind in (("pk", "S"), ("sk", "S"), ("gsi1pk", "S"), ("gsi1sk", "S"), ("prio", "N"))
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "gsi1",
                "KeySchema": [
                    {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                    {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": "by-prio",  # a numeric hash key, no range key
                "KeySchema": [{"AttributeName": "prio", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for job in range(30):
        table.put_item(
            Item={
                "pk": f"job#{job:03d}",
                "sk": "job",
                "gsi1pk": "state#QUEUED" if job % 3 else "state#RUNNING",
                "gsi1sk": f"{(job * 7) % 11:02d}#{job:03d}",
                "prio": Decimal(job % 4) if job % 5 else Decimal("2.0"),  # 2 and 2.0: equal numbers
                "bytes": Decimal(job),
            }
        )
        for attempt in range(job % 4):
            item = {"pk": f"job#{job:03d}", "sk": f"attempt#{attempt:04d}", "bytes": Decimal(attempt)}
            if attempt % 2:
                item |= {"gsi1pk": f"pool#{job % 3}", "gsi1sk": f"{attempt}"}  # only some items in the index
            table.put_item(Item=item)
    table.delete_item(Key={"pk": "job#007", "sk": "attempt#0001"})
    return table


def _pages(table: Any, **query: Any) -> list[Any]:
    """Every page of a query with a small Limit, following LastEvaluatedKey."""
    pages = []
    start: dict[str, Any] | None = None
    while True:
        answer = table.query(**query, **({"ExclusiveStartKey": start} if start else {}))
        answer.pop("ResponseMetadata")
        pages.append(answer)
        start = answer.get("LastEvaluatedKey")
        if start is None:
            return pages


QUERIES: list[dict[str, Any]] = [
    {"KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": "job#003"}},
    {"KeyConditionExpression": "pk = :p", "ExpressionAttributeValues": {":p": "job#nobody"}},
    {
        "KeyConditionExpression": "pk = :p AND begins_with(sk, :a)",
        "ExpressionAttributeValues": {":p": "job#011", ":a": "attempt#"},
        "ScanIndexForward": False,
    },
    {
        "KeyConditionExpression": "pk = :p AND sk BETWEEN :a AND :b",
        "ExpressionAttributeValues": {":p": "job#007", ":a": "attempt#0000", ":b": "attempt#0002"},
    },
    {
        "KeyConditionExpression": "pk = :p",
        "FilterExpression": "#b > :s",
        "ExpressionAttributeNames": {"#b": "bytes"},
        "ExpressionAttributeValues": {":p": "job#015", ":s": Decimal(0)},
        "Limit": 1,
    },
    {"IndexName": "gsi1", "KeyConditionExpression": "gsi1pk = :p", "ExpressionAttributeValues": {":p": "state#QUEUED"}},
    {
        "IndexName": "gsi1",
        "KeyConditionExpression": "gsi1pk = :p AND gsi1sk < :s",
        "ExpressionAttributeValues": {":p": "state#QUEUED", ":s": "05"},
        "ScanIndexForward": False,
        "Limit": 3,
    },
    {"IndexName": "gsi1", "KeyConditionExpression": "gsi1pk = :p", "ExpressionAttributeValues": {":p": "pool#1"}},
    {"IndexName": "by-prio", "KeyConditionExpression": "prio = :n", "ExpressionAttributeValues": {":n": Decimal(2)}},
    {
        "IndexName": "by-prio",
        "KeyConditionExpression": "prio = :n",
        "ExpressionAttributeValues": {":n": Decimal(3)},
        "Limit": 2,
    },
]


def _query_answers(speed: bool) -> list[Any]:
    with mocked(speed):
        table = _table()
        answers = [_pages(table, **query) for query in QUERIES]
        answers.append(table.scan()["Items"])  # Scan still reads every item
        return answers


def test_queries_are_answered_as_stock_moto_answers_them() -> None:
    stock, fast = _query_answers(False), _query_answers(True)
    assert fast == stock
    # and the queries did find items, across pages, so that the comparison says something
    assert len(stock[5][0]["Items"]) == 20
    assert len(stock[6]) > 1
    assert stock[1][0]["Items"] == []


def test_a_query_in_flight_leaves_other_tables_whole() -> None:
    """The candidates a Query is given are its own table's: a Scan of another table made while it is
    scoped sees every item of that table."""
    with mocked(True):
        table = _table()
        client = boto3.client("dynamodb", region_name=REGION)
        client.create_table(
            TableName="other",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for n in range(5):
            client.put_item(TableName="other", Item={"pk": {"S": f"k{n}"}})
        assert (
            len(table.query(KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": "job#002"})["Items"])
            == 3
        )
        assert client.scan(TableName="other")["Count"] == 5
        assert (
            len(
                client.query(
                    TableName="other", KeyConditionExpression="pk = :p", ExpressionAttributeValues={":p": {"S": "k3"}}
                )["Items"]
            )
            == 1
        )


def _instances_answer(speed: bool) -> Any:
    with mocked(speed):
        ec2: Any = boto3.client("ec2", region_name=REGION)
        ec2.run_instances(
            ImageId=AMI,
            MinCount=3,
            MaxCount=3,
            InstanceType="g5.xlarge",
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "spotrelay:job", "Value": "j1"}]}],
        )
        answer = ec2.describe_instances()
        answer.pop("ResponseMetadata")
        for reservation in answer["Reservations"]:  # ids and times differ from one mock to the next
            reservation.pop("ReservationId")
            for instance in reservation["Instances"]:
                for key in (
                    "InstanceId",
                    "LaunchTime",
                    "PrivateDnsName",
                    "PrivateIpAddress",
                    "PublicDnsName",
                    "PublicIpAddress",
                    "NetworkInterfaces",
                    "SubnetId",
                    "VpcId",
                    "UsageOperationUpdateTime",
                    "BlockDeviceMappings",
                    "ClientToken",
                    "Placement",
                ):
                    instance.pop(key, None)
        return answer


def test_describe_instances_is_answered_as_stock_moto_answers_it() -> None:
    stock, fast = _instances_answer(False), _instances_answer(True)
    assert fast == stock
    assert len(stock["Reservations"][0]["Instances"]) == 3
    assert stock["Reservations"][0]["Instances"][0]["Tags"] == [{"Key": "spotrelay:job", "Value": "j1"}]


@pytest.mark.parametrize("region", ["eu-west-1", "ap-southeast-2"])
def test_an_unsigned_request_still_reaches_the_region_and_account_it_names(region: str) -> None:
    with mocked(True):
        sts = boto3.client("sts", region_name=region)
        sqs = boto3.client("sqs", region_name=region)
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        assert region in url
        assert sts.get_caller_identity()["Account"] in url
        assert boto3.client("sqs", region_name="us-east-2").list_queues().get("QueueUrls", []) == []
