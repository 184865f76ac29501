"""CloudFormation resource models moto 5.2.5 lacks, for the types the synthesized template uses.

moto's CloudFormation finds a model by `cloudformation_type()` among the direct subclasses of
`CloudFormationModel`; a type without one is skipped with a warning, and a `Ref`/`GetAtt` to it then
fails the stack. These models create the real thing in moto's backends where moto has one:

- AWS::CloudWatch::Alarm -> moto's CloudWatch alarm (DescribeAlarms sees it; moto evaluates no alarm:
  the replay emits its state changes).
- AWS::SQS::QueuePolicy -> the queues' `Policy` attribute.
- AWS::S3::BucketPolicy -> the bucket's policy.
- AWS::SNS::TopicPolicy -> the topics' `Policy` attribute.
- AWS::CDK::Metadata -> nothing (CDK's version reporting; a no-op model, so that moto does not warn).

Defining the classes registers them (for the whole process: they only add types moto does not know);
`register()` clears moto's cached model map so that it sees them.
"""

from __future__ import annotations

import json
from typing import Any

from moto.cloudformation import parsing as cfn_parsing
from moto.core.common_models import CloudFormationModel


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class LocalAlarm(CloudFormationModel):
    """AWS::CloudWatch::Alarm (Ref: the alarm name; GetAtt Arn)."""

    def __init__(self, name: str, arn: str) -> None:
        self.name = name
        self.arn = arn

    @staticmethod
    def cloudformation_name_type() -> str:
        return "AlarmName"

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CloudWatch::Alarm"

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Arn"

    def get_cfn_attribute(self, attribute_name: str) -> str:
        if attribute_name == "Arn":
            return self.arn
        raise NotImplementedError(f"AWS::CloudWatch::Alarm has no attribute {attribute_name}")

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LocalAlarm:
        from moto.cloudwatch.models import cloudwatch_backends

        properties = cloudformation_json.get("Properties", {})
        alarm = cloudwatch_backends[account_id][region_name].put_metric_alarm(
            name=properties.get("AlarmName", resource_name),
            namespace=properties.get("Namespace"),
            metric_name=properties.get("MetricName"),
            comparison_operator=properties.get("ComparisonOperator"),
            evaluation_periods=int(properties.get("EvaluationPeriods", 1)),
            period=int(properties.get("Period", 60)),
            threshold=float(properties.get("Threshold", 0)),
            statistic=properties.get("Statistic"),
            description=properties.get("AlarmDescription", ""),
            dimensions=list(properties.get("Dimensions", [])),
            alarm_actions=list(properties.get("AlarmActions", [])),
            ok_actions=list(properties.get("OKActions", [])),
            insufficient_data_actions=list(properties.get("InsufficientDataActions", [])),
            datapoints_to_alarm=properties.get("DatapointsToAlarm"),
            extended_statistic=properties.get("ExtendedStatistic"),
            unit=properties.get("Unit"),
            actions_enabled=bool(properties.get("ActionsEnabled", True)),
            treat_missing_data=properties.get("TreatMissingData"),
            tags=list(properties.get("Tags", [])),
        )
        return cls(alarm.name, alarm.alarm_arn)

    @classmethod
    def delete_from_cloudformation_json(
        cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str
    ) -> None:
        from moto.cloudwatch.models import cloudwatch_backends

        cloudwatch_backends[account_id][region_name].delete_alarms([resource_name])


class _NamedOnly:
    """What a model whose resource has no name of its own (a policy, metadata) shares: its logical id is its
    physical id. A mixin: moto looks for models among the direct subclasses of CloudFormationModel."""

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def cloudformation_name_type() -> str:
        return ""

    @property
    def physical_resource_id(self) -> str:
        return self.name


class LocalQueuePolicy(_NamedOnly, CloudFormationModel):
    """AWS::SQS::QueuePolicy: sets each queue's `Policy` attribute."""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::SQS::QueuePolicy"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LocalQueuePolicy:
        from moto.sqs.models import sqs_backends

        properties = cloudformation_json.get("Properties", {})
        policy = _json_text(properties.get("PolicyDocument", {}))
        backend = sqs_backends[account_id][region_name]
        for queue_url in properties.get("Queues", []):
            queue_name = str(queue_url).rstrip("/").rsplit("/", 1)[-1]
            backend.set_queue_attributes(queue_name, {"Policy": policy})
        return cls(resource_name)


class LocalBucketPolicy(_NamedOnly, CloudFormationModel):
    """AWS::S3::BucketPolicy: puts the bucket's policy."""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::S3::BucketPolicy"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LocalBucketPolicy:
        from moto.s3.models import s3_backends
        from moto.utilities.utils import get_partition

        properties = cloudformation_json.get("Properties", {})
        policy = _json_text(properties.get("PolicyDocument", {}))
        s3_backends[account_id][get_partition(region_name)].put_bucket_policy(
            properties["Bucket"], policy.encode("utf-8")
        )
        return cls(resource_name)


class LocalTopicPolicy(_NamedOnly, CloudFormationModel):
    """AWS::SNS::TopicPolicy: sets each topic's `Policy` attribute."""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::SNS::TopicPolicy"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LocalTopicPolicy:
        from moto.sns.models import sns_backends

        properties = cloudformation_json.get("Properties", {})
        policy = _json_text(properties.get("PolicyDocument", {}))
        backend = sns_backends[account_id][region_name]
        for topic_arn in properties.get("Topics", []):  # a Topic's Ref is its ARN
            backend.set_topic_attribute(str(topic_arn), "policy", policy)  # as SetTopicAttributes names it
        return cls(resource_name)


class LocalCdkMetadata(_NamedOnly, CloudFormationModel):
    """AWS::CDK::Metadata: nothing to create."""

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CDK::Metadata"

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> LocalCdkMetadata:
        return cls(resource_name)


ADDED_TYPES = tuple(
    model.cloudformation_type()
    for model in (LocalAlarm, LocalQueuePolicy, LocalBucketPolicy, LocalTopicPolicy, LocalCdkMetadata)
)


def register() -> None:
    """Make moto's CloudFormation see the models above (its model map is cached on first use)."""
    cfn_parsing.get_model_list.cache_clear()
    cfn_parsing.get_model_map.cache_clear()
    cfn_parsing.get_name_type_map.cache_clear()
