"""moto-backed AWS for the adapter tests: the table, bucket, queues, state machine and network the
stack creates, in us-east-1, with fake credentials (nothing here can reach a real account)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import boto3
import pytest
from fakes import FakeClock
from moto import mock_aws

from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.queue import SqsJobQueue
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.workflow import StepFunctionsWorkflow

from .aws_resources import IMAGE_ID, REGION, ROLE_ARN, TABLE, ZONES, Lifecycle, Network, Queues
from .function_harness import Deployment
from .moto_progress import MOTO_PROGRESS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient

# Run waits for a task token it hands out through an SQS queue, like the real JobLifecycle's Run state
# (which hands it to the launch function, and from there to the agent).
LIFECYCLE = {
    "StartAt": "Run",
    "States": {
        "Run": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "Parameters": {
                "QueueUrl.$": "$.token_queue_url",
                "MessageBody": {"job_id.$": "$$.Execution.Name", "task_token.$": "$$.Task.Token"},
            },
            "End": True,
        }
    },
}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        MOTO_PROGRESS.hook_into_moto(monkeypatch)  # waits on what moto's execution threads do: see moto_progress
        yield


# --- DynamoDB ---------------------------------------------------------------------------------------


@pytest.fixture
def dynamodb(aws: None) -> DynamoDBClient:
    return boto3.client("dynamodb", region_name=REGION)


@pytest.fixture
def table(dynamodb: DynamoDBClient) -> str:
    """The stack's table: pk/sk, one GSI (gsi1pk/gsi1sk, projection ALL), TTL on expires_at."""
    dynamodb.create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": "S"} for name in ("pk", "sk", "gsi1pk", "gsi1sk")
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "gsi1",
                "KeySchema": [
                    {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                    {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    dynamodb.update_time_to_live(
        TableName=TABLE, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )
    return TABLE


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> DynamoJobStore:
    return DynamoJobStore(table, dynamodb, clock=clock)


# --- S3 ---------------------------------------------------------------------------------------------


@pytest.fixture
def bucket(aws: None) -> str:
    s3: S3Client = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="spotrelay-checkpoints-test")
    return "spotrelay-checkpoints-test"


# --- SQS --------------------------------------------------------------------------------------------


@pytest.fixture
def sqs(aws: None) -> SQSClient:
    return boto3.client("sqs", region_name=REGION)


@pytest.fixture
def queues(sqs: SQSClient) -> Queues:
    dlq_url = sqs.create_queue(QueueName="spotrelay-jobs-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(
        QueueName="spotrelay-jobs",
        Attributes={
            "VisibilityTimeout": "60",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
        },
    )["QueueUrl"]
    return Queues(queue_url=queue_url, dlq_url=dlq_url)


@pytest.fixture
def job_queue(sqs: SQSClient, queues: Queues) -> SqsJobQueue:
    return SqsJobQueue(sqs, queues.queue_url, queues.dlq_url)


# --- Step Functions ---------------------------------------------------------------------------------


@pytest.fixture
def sfn(aws: None) -> SFNClient:
    return boto3.client("stepfunctions", region_name=REGION)


@pytest.fixture
def lifecycle(sfn: SFNClient, sqs: SQSClient) -> Lifecycle:
    token_queue_url = sqs.create_queue(QueueName="spotrelay-task-tokens")["QueueUrl"]
    arn = sfn.create_state_machine(name="JobLifecycle", definition=json.dumps(LIFECYCLE), roleArn=ROLE_ARN)
    return Lifecycle(state_machine_arn=arn["stateMachineArn"], token_queue_url=token_queue_url)


@pytest.fixture
def workflow(sfn: SFNClient, lifecycle: Lifecycle) -> StepFunctionsWorkflow:
    return StepFunctionsWorkflow(sfn, lifecycle.state_machine_arn)


# --- EC2 --------------------------------------------------------------------------------------------


@pytest.fixture
def ec2(aws: None) -> EC2Client:
    return boto3.client("ec2", region_name=REGION)


@pytest.fixture
def network(ec2: EC2Client) -> Network:
    vpc_id = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = {
        zone: ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"10.42.{n}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
        for n, zone in enumerate(ZONES)
    }
    assert ec2.describe_images(ImageIds=[IMAGE_ID])["Images"], "moto no longer ships this AMI"
    template = ec2.create_launch_template(
        LaunchTemplateName="spotrelay-worker",
        LaunchTemplateData={"ImageId": IMAGE_ID, "MetadataOptions": {"HttpTokens": "required"}},
    )
    return Network(launch_template_id=template["LaunchTemplate"]["LaunchTemplateId"], subnets=subnets)


@pytest.fixture
def compute(ec2: EC2Client, network: Network) -> Ec2Compute:
    return Ec2Compute(ec2, launch_template_id=network.launch_template_id, region=REGION)


# --- The Lambda functions on these resources (tests/integration/test_functions_*) -----------------


@pytest.fixture
def deployment(
    monkeypatch: pytest.MonkeyPatch,
    clock: FakeClock,
    store: DynamoJobStore,
    queues: Queues,
    lifecycle: Lifecycle,
    network: Network,
) -> Deployment:
    return Deployment.on(monkeypatch, clock, store, queues, lifecycle, network)
