"""Least-privilege permissions of the nine functions, one policy per concern.

- Every function but vend: read/write its items in the table and the `gsi1` index (named actions, exact
  ARNs); vend: GetItem only (its sts:AssumeRole of JobRole is in `job_credentials_construct`).
- launch, and reconcile (the spot standby it starts before moving a job off on-demand):
  `ec2:RunInstances` (the only way spotrelay launches) of an *instance* only for the allowed GPU families
  (`ec2:InstanceType` like `g5.*`) and only when the request tags it `spotrelay:managed=true`; the
  other resources of a launch are this stack's launch template, worker security group, subnets and
  AMI by exact ARN, plus the new volumes, network interfaces and spot requests (ids that do not
  exist yet, hence `*`). Tags only while launching (`ec2:CreateAction`). `iam:PassRole` of the
  worker role only, and only to EC2.
- finalize/reconcile/cancel (and launch, to undo a half-recorded launch): `ec2:TerminateInstances`
  only of instances tagged `spotrelay:managed=true`.
- EC2 Describe* calls (no resource-level permissions exist for them): one read-only policy.
- Step Functions: StartExecution on JobLifecycle; Describe/StopExecution on its executions (resume:
  DescribeExecution only); the task-token calls for ec2_events/cancel/reconcile.
- dispatcher: receive/delete on the job queue, send to the DLQ; finalize, cancel, resume: invoke the
  dispatcher.
No statement has a `*` action or a service-wide action wildcard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from spotrelay.config import TAG_MANAGED
from spotrelay.control.vend import TASK_TOKEN_ACTIONS
from stacks.functions_construct import Functions
from stacks.storage_construct import CHECKPOINT_PREFIX, GSI1
from stacks.suppressions import acknowledge_wildcard_resources
from stacks.worker_construct import Worker

MANAGED_TAG_VALUE = "true"
EXECUTIONS_REASON = (
    "Executions are named by job id, so their ARNs are only known per job: the resource is every "
    "execution of this stack's JobLifecycle state machine, and of no other."
)
TASK_TOKEN_REASON = (
    "SendTaskSuccess/SendTaskFailure/SendTaskHeartbeat take a task token, not a resource: Step Functions "
    "supports no resource-level permission for them, so their Resource must be '*'. The statement holds "
    "only task-token actions, and a caller needs a live token of one of our executions to use them."
)
TABLE_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
)
EC2_READ_ACTIONS = (
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeSpotPriceHistory",
)
LAUNCH_ACTIONS = ("ec2:RunInstances",)
EC2_READERS = ("place", "launch", "ec2_events", "finalize", "reconcile", "cancel")
TERMINATORS = ("launch", "finalize", "reconcile", "cancel")
LAUNCHERS = ("launch", "reconcile")
TASK_TOKEN_SENDERS = ("ec2_events", "cancel", "reconcile")
EXECUTION_MANAGERS = ("reconcile", "cancel")
TABLE_READERS = ("vend",)


class FunctionPermissions(Construct):
    """Everything the functions may do beyond writing their logs and traces (see the module docstring)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        functions: Functions,
        allowed_gpu_families: Sequence[str],
        table: dynamodb.ITable,
        bucket: s3.IBucket,
        bucket_key: kms.IKey,
        queue: sqs.IQueue,
        dead_letter_queue: sqs.IQueue,
        queue_key: kms.IKey,
        worker: Worker,
        subnet_ids: Sequence[str],
        state_machine_arn: str,
        state_machine_name: str,
    ) -> None:
        super().__init__(scope, id)
        self._functions = functions
        stack = Stack.of(self)
        roles = functions.roles

        for name, role in roles.items():  # in each role's own (default) policy
            if name in TABLE_READERS:
                continue
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=list(TABLE_ACTIONS),
                    resources=[table.table_arn, f"{table.table_arn}/index/{GSI1}"],
                )
            )
        for name in TABLE_READERS:  # vend reads an instance's record and its attempt, nothing else
            roles[name].add_to_principal_policy(
                iam.PolicyStatement(actions=["dynamodb:GetItem"], resources=[table.table_arn])
            )

        # dispatcher: the queue, the DLQ, and starting (or finding) a job's execution.
        self._policy(
            "DispatcherQueues",
            ["dispatcher"],
            iam.PolicyStatement(
                actions=[
                    "sqs:ReceiveMessage",
                    "sqs:DeleteMessage",
                    "sqs:ChangeMessageVisibility",
                    "sqs:GetQueueAttributes",
                ],
                resources=[queue.queue_arn],
            ),
            iam.PolicyStatement(
                actions=["sqs:SendMessage", "sqs:GetQueueAttributes"], resources=[dead_letter_queue.queue_arn]
            ),
            iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[queue_key.key_arn]),
        )
        executions = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self._policy(
            "DispatcherExecutions",
            ["dispatcher"],
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[state_machine_arn]),
            _acknowledged(
                iam.PolicyStatement(actions=["states:DescribeExecution"], resources=[executions]),
                EXECUTIONS_REASON,
            ),
        )
        self._policy(
            "ManageExecutions",
            EXECUTION_MANAGERS,
            _acknowledged(
                iam.PolicyStatement(
                    actions=["states:DescribeExecution", "states:StopExecution"], resources=[executions]
                ),
                EXECUTIONS_REASON,
            ),
            iam.PolicyStatement(actions=["states:ListExecutions"], resources=[state_machine_arn]),
        )
        self._policy(
            "ReadExecutions",
            ["resume"],  # a resumed job's previous run must have ended: resume only reads its execution
            _acknowledged(
                iam.PolicyStatement(actions=["states:DescribeExecution"], resources=[executions]),
                EXECUTIONS_REASON,
            ),
        )
        self._policy(
            "TaskTokenCallbacks",
            TASK_TOKEN_SENDERS,
            _acknowledged(
                iam.PolicyStatement(actions=list(TASK_TOKEN_ACTIONS[:2]), resources=["*"]), TASK_TOKEN_REASON
            ),
        )

        # recover: reads a job's checkpoint manifests (the pointer itself is in the table).
        self._policy(
            "RecoverCheckpoints",
            ["recover"],
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{CHECKPOINT_PREFIX}*"]}},
            ),
            _acknowledged(
                iam.PolicyStatement(
                    actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{CHECKPOINT_PREFIX}*")]
                ),
                "Recover reads the manifests of any job's checkpoints (jobs/<job_id>/checkpoints/...): read-only, "
                "and only the jobs/ prefix of the checkpoint bucket.",
            ),
            iam.PolicyStatement(actions=["kms:Decrypt"], resources=[bucket_key.key_arn]),
        )

        # finalize and cancel wake the dispatcher when a job's slot frees up, resume when a job is queued again.
        self._policy(
            "WakeDispatcher",
            ["finalize", "cancel", "resume"],
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"], resources=[functions.functions["dispatcher"].function_arn]
            ),
        )

        self._policy(
            "Ec2Read",
            EC2_READERS,
            _acknowledged(
                iam.PolicyStatement(actions=list(EC2_READ_ACTIONS), resources=["*"]),
                "EC2 Describe* calls and DescribeSpotPriceHistory support no resource-level permissions; "
                "this statement is read-only and lists each Describe action by name (no Describe*).",
            ),
        )

        # The dispatcher's budget counts a running spot job at its pool's price now: that one read, no other EC2
        self._policy(
            "SpotPriceRead",
            ["dispatcher"],
            _acknowledged(
                iam.PolicyStatement(actions=["ec2:DescribeSpotPriceHistory"], resources=["*"]),
                "DescribeSpotPriceHistory supports no resource-level permissions; read-only, one action.",
            ),
        )

        instances = _ec2_arn(stack, "instance/*")
        self._policy(
            "TerminateManagedInstances",
            TERMINATORS,
            _acknowledged(
                iam.PolicyStatement(
                    actions=["ec2:TerminateInstances"],
                    resources=[instances],
                    conditions={"StringEquals": {f"aws:ResourceTag/{TAG_MANAGED}": MANAGED_TAG_VALUE}},
                ),
                f"Workers are launched per attempt, so their ids are unknown here; only instances tagged "
                f"{TAG_MANAGED}=true (which only launch and reconcile can create) can be terminated.",
            ),
        )
        self._launch_policy(
            allowed_gpu_families=allowed_gpu_families,
            worker=worker,
            subnet_ids=subnet_ids,
        )

    def _launch_policy(self, *, allowed_gpu_families: Sequence[str], worker: Worker, subnet_ids: Sequence[str]) -> None:
        stack = Stack.of(self)
        created = [_ec2_arn(stack, f"{kind}/*") for kind in ("volume", "network-interface", "spot-instances-request")]
        self._policy(
            "LaunchWorkers",
            LAUNCHERS,
            _acknowledged(
                iam.PolicyStatement(
                    sid="LaunchOnlyAllowedGpuFamiliesTagged",
                    actions=list(LAUNCH_ACTIONS),
                    resources=[_ec2_arn(stack, "instance/*")],
                    conditions={
                        "StringLike": {"ec2:InstanceType": [f"{family}.*" for family in allowed_gpu_families]},
                        "StringEquals": {f"aws:RequestTag/{TAG_MANAGED}": MANAGED_TAG_VALUE},
                    },
                ),
                "A new instance has no id yet: the instance resource is instance/*, constrained to the allowed "
                f"GPU families (ec2:InstanceType) and to requests that tag it {TAG_MANAGED}=true.",
            ),
            _acknowledged(
                iam.PolicyStatement(
                    sid="LaunchCreatesItsVolumesAndInterfaces", actions=list(LAUNCH_ACTIONS), resources=created
                ),
                "The volumes, network interfaces and spot requests a launch creates have no ids yet; "
                "the same request must also pass the instance statement (GPU family and tag conditions).",
            ),
            iam.PolicyStatement(
                sid="LaunchFromOurTemplateImageNetwork",
                actions=list(LAUNCH_ACTIONS),
                resources=[
                    _ec2_arn(stack, f"launch-template/{worker.launch_template_id}"),
                    _ec2_arn(stack, f"security-group/{worker.security_group.security_group_id}"),
                    stack.format_arn(service="ec2", account="", resource="image", resource_name=worker.image_id),
                    *(_ec2_arn(stack, f"subnet/{subnet_id}") for subnet_id in subnet_ids),
                ],
            ),
            _acknowledged(
                iam.PolicyStatement(
                    sid="TagOnlyWhileLaunching",
                    actions=["ec2:CreateTags"],
                    resources=[_ec2_arn(stack, "instance/*"), *created],
                    conditions={
                        "StringEquals": {"ec2:CreateAction": [action.split(":")[1] for action in LAUNCH_ACTIONS]}
                    },
                ),
                "Tags are applied in the launch request itself (ec2:CreateAction RunInstances) to "
                "resources that do not exist yet; CreateTags on anything existing is not allowed.",
            ),
            iam.PolicyStatement(
                sid="PassOnlyTheWorkerRoleToEc2",
                actions=["iam:PassRole"],
                resources=[worker.role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            ),
            iam.PolicyStatement(
                sid="SpotServiceLinkedRoles",
                actions=["iam:CreateServiceLinkedRole"],
                resources=[
                    f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot",
                ],
                conditions={"StringEquals": {"iam:AWSServiceName": "spot.amazonaws.com"}},
            ),
        )

    def _policy(
        self, policy_id: str, function_names: Iterable[str], *grants: iam.PolicyStatement | Grant
    ) -> iam.Policy:
        """One policy for `function_names`' roles; wildcard resources acknowledged with their grant's reason."""
        names = list(function_names)
        wrapped = [grant if isinstance(grant, Grant) else Grant(grant, None) for grant in grants]
        policy = iam.Policy(
            self,
            policy_id,
            statements=[grant.statement for grant in wrapped],
            roles=[self._functions.roles[name] for name in names],
        )
        for grant in wrapped:
            if grant.wildcard_reason is not None:
                acknowledge_wildcard_resources(policy, grant.statement, grant.wildcard_reason)
        return policy


class Grant(NamedTuple):
    """A statement whose wildcard resources are intended, and why."""

    statement: iam.PolicyStatement
    wildcard_reason: str | None


def _acknowledged(statement: iam.PolicyStatement, reason: str) -> Grant:
    return Grant(statement, reason)


def _ec2_arn(stack: Stack, resource: str) -> str:
    kind, _, name = resource.partition("/")
    return stack.format_arn(service="ec2", resource=kind, resource_name=name)
