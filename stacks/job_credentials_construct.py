"""JobRole and the grants of the token vending machine (spotrelay.control.vend).

- JobRole: trusted by the vend function's role only (sts:AssumeRole and sts:TagSession, and only with
  the `spotrelay-job-id` session tag). Its policy is `job_statements(JOB_ID_VARIABLE)`: every resource
  names the job of the session's tag, so a session is one job's even before Vend's session policy (the
  same statements with the literal job id) narrows it again. A chained session lasts an hour at most.
- vend: sts:AssumeRole/TagSession of JobRole only, and logs:CreateLogStream in the agents' log group (it
  makes each attempt's stream); its GetItem is in `iam_construct`. It calls STS's
  GetCallerIdentity with the caller's signature, which needs no permission of its own.
- The worker instance role: lambda:InvokeFunction of vend only (the unqualified function ARN). It writes
  no log stream: the agent ships its lines with the job's credentials, to the job's streams only.
"""

from __future__ import annotations

import jsii
from aws_cdk import Aws, IStableStringProducer, Lazy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from spotrelay.control.vend import JOB_ID_VARIABLE, SESSION_TAG_JOB_ID, JobResources, job_statements
from stacks.suppressions import acknowledge_wildcard_resources

TASK_TOKEN_REASON = (
    "SendTaskSuccess/SendTaskFailure/SendTaskHeartbeat take a task token, not a resource: Step Functions "
    "supports no resource-level permission for them, so their Resource must be '*'. The token is the "
    "capability, and a job's credentials can read only their own job's records, where its tokens are."
)
JOB_OBJECTS_REASON = (
    "Checkpoint keys are jobs/<job_id>/checkpoints/<attempt>-<seq>/...: new keys on every checkpoint. The job "
    "id is the session's spotrelay-job-id tag (a policy variable), so each session reaches one job's prefix."
)


@jsii.implements(IStableStringProducer)
class Deferred:
    """A value a construct made later fills in (`Lazy.string(deferred)`), for references that go both
    ways between constructs: vend's environment names JobRole, whose trust names vend's role."""

    def __init__(self) -> None:
        self.value: str | None = None

    def produce(self) -> str | None:
        if self.value is None:
            raise ValueError("a deferred value was never filled in")
        return self.value

    def token(self) -> str:
        return Lazy.string(self)


class JobCredentials(Construct):
    """`job_role`, trusted by `vend_role` only; the worker role may invoke `vend` and nothing else of it."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        vend: lambda_.IFunction,
        vend_role: iam.IRole,
        worker_role: iam.IRole,
        table: dynamodb.ITable,
        bucket: s3.IBucket,
        bucket_key: kms.IKey,
        agent_logs: logs.ILogGroup,
        agent_log_group_arn: str,
    ) -> None:
        super().__init__(scope, id)
        self.resources = JobResources(
            bucket_arn=bucket.bucket_arn,
            table_arn=table.table_arn,
            bucket_key_arn=bucket_key.key_arn,
            region=Aws.REGION,
            agent_log_group_arn=agent_log_group_arn,
        )
        self.job_role = iam.Role(
            self,
            "JobRole",
            # Only sessions that carry the job's tag (without it the policy's variables resolve to nothing)
            assumed_by=iam.ArnPrincipal(vend_role.role_arn)
            .with_conditions({"Null": {f"aws:RequestTag/{SESSION_TAG_JOB_ID}": "false"}})
            .with_session_tags(),
            description="spotrelay job credentials: one job's checkpoints, records and task tokens (via vend)",
        )
        policy = iam.Policy(self, "JobPolicy", roles=[self.job_role])
        for raw in job_statements(JOB_ID_VARIABLE, self.resources):
            statement = iam.PolicyStatement.from_json(raw)
            policy.add_statements(statement)
            if any("*" in str(Stack.of(self).resolve(r)) for r in statement.resources):
                reason = TASK_TOKEN_REASON if raw["Sid"].startswith("TaskTokens") else JOB_OBJECTS_REASON
                acknowledge_wildcard_resources(policy, statement, reason)

        vend_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["sts:AssumeRole", "sts:TagSession"], resources=[self.job_role.role_arn])
        )
        agent_logs.grant(vend_role, "logs:CreateLogStream")  # each attempt's stream, before its agent writes
        worker_role.add_to_principal_policy(
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[vend.function_arn])
        )
