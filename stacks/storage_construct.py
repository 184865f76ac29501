"""State that outlives any one function or instance: the job table and the checkpoint bucket.

Table (single-table design, on-demand, PITR): `pk`/`sk` strings; GSI `gsi1` on `gsi1pk`/`gsi1sk`
(queued jobs by priority then age, active jobs); items with an `expires_at` epoch (pool blocks,
observations) expire by TTL. Encrypted with the AWS-managed key: every reader is in this account, and
it keeps KMS grants (and `kms:*Data key*` wildcards) out of every role that touches the table.

Checkpoint bucket: `jobs/<job_id>/checkpoints/<attempt>-<seq>/...` and the agent wheel under
`agent/`. SSE-KMS with a customer-managed key (bucket keys on, so one KMS call per object batch),
versioned, TLS >= 1.2 only, no public access; `jobs/` expires after `checkpoint_retention_days`
and incomplete multipart uploads are aborted after a day. Access logs go to a second bucket.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from spotrelay.control.vend import CHECKPOINT_PREFIX as JOB_CHECKPOINT_PREFIX
from stacks.config import SpotRelayConfig
from stacks.suppressions import acknowledge

CHECKPOINT_PREFIX = JOB_CHECKPOINT_PREFIX  # jobs/: the prefix job credentials are scoped within
AGENT_PREFIX = "agent/"
TTL_ATTRIBUTE = "expires_at"
GSI1 = "gsi1"
ACCESS_LOG_RETENTION_DAYS = 90


class Storage(Construct):
    """`table`, `bucket` (checkpoints), `bucket_key`, `access_logs_bucket`."""

    def __init__(self, scope: Construct, id: str, *, config: SpotRelayConfig) -> None:
        super().__init__(scope, id)
        stack_name = Stack.of(self).stack_name
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TTL_ATTRIBUTE,
        )
        self.table.add_global_secondary_index(
            index_name=GSI1,
            partition_key=dynamodb.Attribute(name="gsi1pk", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="gsi1sk", type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.ALL,
        )

        self.access_logs_bucket = s3.Bucket(
            self,
            "AccessLogsBucket",
            # S3 server access logging delivers only to SSE-S3 buckets.
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-logs",
                    expiration=Duration.days(ACCESS_LOG_RETENTION_DAYS),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                )
            ],
        )
        acknowledge(
            self.access_logs_bucket,
            "S1",
            "This bucket is the server-access-log destination of the checkpoint bucket (and holds the VPC "
            "flow logs); logging its own accesses would need a third bucket and log the log deliveries.",
        )

        self.bucket_key = kms.Key(
            self,
            "CheckpointKey",
            description=f"{stack_name}: encrypts job checkpoints and the agent wheel",
            enable_key_rotation=True,
        )
        self.bucket = s3.Bucket(
            self,
            "CheckpointBucket",
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.bucket_key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_logs_bucket,
            server_access_logs_prefix="checkpoint-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-job-checkpoints",
                    prefix=CHECKPOINT_PREFIX,
                    expiration=Duration.days(config.checkpoint_retention_days),
                    # Versioning keeps overwritten/expired objects as noncurrent versions: a week, then gone.
                    noncurrent_version_expiration=Duration.days(7),
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                ),
                s3.LifecycleRule(id="remove-expired-delete-markers", expired_object_delete_marker=True),
            ],
        )
