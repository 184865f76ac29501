"""SchedulerStack: composes the constructs, tags everything, exports what clients need, and runs cdk-nag.

`build_scheduler(app, config)` is what `app.py` and the infrastructure tests both call, so the tests
check exactly what `cdk synth` produces (same constructs, same nag checks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import App, CfnOutput, Stack, Tags, Validations
from cdk_nag import AwsSolutionsChecks
from constructs import Construct

from spotrelay.config import (
    ENV_AGENT_LOG_GROUP_ARN,
    ENV_ALLOWED_FAMILIES,
    ENV_BLOCK_MINUTES,
    ENV_BUCKET,
    ENV_BUCKET_ARN,
    ENV_BUCKET_KEY_ARN,
    ENV_BUDGET_USD_PER_HOUR,
    ENV_DLQ_URL,
    ENV_HEARTBEAT_SECONDS,
    ENV_JOB_ROLE_ARN,
    ENV_LAUNCH_TEMPLATE_ID,
    ENV_MAX_CONCURRENT_JOBS,
    ENV_QUEUE_URL,
    ENV_SPOT_VCPU_QUOTAS,
    ENV_STATE_MACHINE_ARN,
    ENV_SUBNETS,
    ENV_TABLE,
    ENV_TABLE_ARN,
    ENV_WORKER_ROLE_ARN,
)
from stacks.config import SpotRelayConfig
from stacks.dashboard_construct import Dashboard, DeadLetterAlarms
from stacks.events_construct import REBALANCE_RECOMMENDATION, SPOT_INTERRUPTION, EventRules
from stacks.functions_construct import TIMEOUTS, Functions
from stacks.iam_construct import FunctionPermissions
from stacks.job_credentials_construct import Deferred, JobCredentials
from stacks.lifecycle_construct import JobLifecycle, state_machine_arn
from stacks.network_construct import Network
from stacks.queue_construct import JobQueue
from stacks.storage_construct import Storage
from stacks.worker_construct import Worker

REPO_ROOT = Path(__file__).resolve().parent.parent
PROJECT_TAG = ("project", "spotrelay")


class SchedulerStack(Stack):
    """Everything spotrelay runs on in one account and region."""

    def __init__(self, scope: Construct, id: str, *, config: SpotRelayConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            id,
            description="spotrelay: GPU jobs on EC2 Spot - queue, scheduler functions, JobLifecycle, workers",
            **kwargs,
        )
        self.config = config
        self.storage = Storage(self, "Storage", config=config)
        self.network = Network(self, "Network", config=config, flow_logs_bucket=self.storage.access_logs_bucket)
        self.job_queue = JobQueue(self, "JobQueue", dispatcher_timeout=TIMEOUTS["dispatcher"])
        # Both ways between constructs: the workers' unit names vend, vend's environment names JobRole
        vend_function_name, job_role_arn = Deferred(), Deferred()
        self.worker = Worker(
            self,
            "Worker",
            config=config,
            vpc=self.network.vpc,
            table=self.storage.table,
            bucket=self.storage.bucket,
            vend_function_name=vend_function_name.token(),
        )
        self.functions = Functions(
            self,
            "Functions",
            config=config,
            code_root=REPO_ROOT,
            settings_values={
                ENV_TABLE: self.storage.table.table_name,
                ENV_BUCKET: self.storage.bucket.bucket_name,
                ENV_QUEUE_URL: self.job_queue.queue.queue_url,
                ENV_DLQ_URL: self.job_queue.dead_letter_queue.queue_url,
                ENV_LAUNCH_TEMPLATE_ID: self.worker.launch_template_id,
                ENV_SUBNETS: self.to_json_string(dict(self.network.subnet_ids_by_zone)),
                ENV_ALLOWED_FAMILIES: ",".join(config.allowed_gpu_families),
                ENV_MAX_CONCURRENT_JOBS: str(config.max_concurrent_jobs),
                ENV_BUDGET_USD_PER_HOUR: str(config.budget_usd_per_hour),
                ENV_SPOT_VCPU_QUOTAS: json.dumps(config.spot_vcpu_quotas, sort_keys=True),
                ENV_BLOCK_MINUTES: str(config.block_minutes),
                ENV_HEARTBEAT_SECONDS: str(config.heartbeat_seconds),
                ENV_STATE_MACHINE_ARN: state_machine_arn(self),
                ENV_WORKER_ROLE_ARN: self.worker.role.role_arn,
                ENV_JOB_ROLE_ARN: job_role_arn.token(),
                ENV_TABLE_ARN: self.storage.table.table_arn,
                ENV_BUCKET_ARN: self.storage.bucket.bucket_arn,
                ENV_BUCKET_KEY_ARN: self.storage.bucket_key.key_arn,
                ENV_AGENT_LOG_GROUP_ARN: self.worker.log_group_arn,
            },
        )
        functions = self.functions.functions
        self.job_credentials = JobCredentials(
            self,
            "JobCredentials",
            vend=functions["vend"],
            vend_role=self.functions.roles["vend"],
            worker_role=self.worker.role,
            table=self.storage.table,
            bucket=self.storage.bucket,
            bucket_key=self.storage.bucket_key,
            agent_logs=self.worker.log_group,
            agent_log_group_arn=self.worker.log_group_arn,
        )
        vend_function_name.value = functions["vend"].function_name
        job_role_arn.value = self.job_credentials.job_role.role_arn
        self.lifecycle = JobLifecycle(
            self,
            "JobLifecycle",
            place=functions["place"],
            launch=functions["launch"],
            recover=functions["recover"],
            finalize=functions["finalize"],
        )
        FunctionPermissions(
            self,
            "Permissions",
            functions=self.functions,
            allowed_gpu_families=config.allowed_gpu_families,
            table=self.storage.table,
            bucket=self.storage.bucket,
            bucket_key=self.storage.bucket_key,
            queue=self.job_queue.queue,
            dead_letter_queue=self.job_queue.dead_letter_queue,
            queue_key=self.job_queue.key,
            worker=self.worker,
            subnet_ids=list(self.network.subnet_ids_by_zone.values()),
            state_machine_arn=state_machine_arn(self),
            state_machine_name=self.lifecycle.state_machine_name,
        )
        self.event_rules = EventRules(
            self,
            "Events",
            ec2_events=functions["ec2_events"],
            dispatcher=functions["dispatcher"],
            reconcile=functions["reconcile"],
            depth_alarm=self.job_queue.depth_alarm,
            dead_letter_key=self.functions.dead_letter_key,
        )
        self.dead_letter_alarms = DeadLetterAlarms(
            self,
            "OperatorAlerts",
            job_dead_letter_queue=self.job_queue.dead_letter_queue,
            ec2_events_dead_letter_queue=self.functions.dead_letter_queues["ec2_events"],
            event_target_dead_letter_queue=self.event_rules.dead_letter_queue,
        )
        Dashboard(
            self,
            "Dashboard",
            queue=self.job_queue.queue,
            dead_letter_queue=self.job_queue.dead_letter_queue,
            event_dead_letter_queue=self.event_rules.dead_letter_queue,
            state_machine=self.lifecycle.state_machine,
            interruption_rule=self.event_rules.rules_by_detail_type[SPOT_INTERRUPTION],
            rebalance_rule=self.event_rules.rules_by_detail_type[REBALANCE_RECOMMENDATION],
            functions=functions,
        )
        Tags.of(self).add(*PROJECT_TAG)

        CfnOutput(self, "QueueUrl", value=self.job_queue.queue.queue_url, description="Submit jobs here")
        CfnOutput(self, "DeadLetterQueueUrl", value=self.job_queue.dead_letter_queue.queue_url)
        CfnOutput(self, "TableName", value=self.storage.table.table_name)
        CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name, description="Checkpoints and the agent")
        CfnOutput(self, "StateMachineArn", value=self.lifecycle.state_machine.state_machine_arn)
        CfnOutput(self, "LaunchTemplateId", value=self.worker.launch_template_id)
        # What the user commands need (spotrelay/aws/deployed_stack.py): submit wakes the dispatcher, cancel and resume
        # invoke their functions, logs reads the agent log group
        CfnOutput(self, "DispatcherFunctionName", value=functions["dispatcher"].function_name)
        CfnOutput(self, "CancelFunctionName", value=functions["cancel"].function_name)
        CfnOutput(self, "ResumeFunctionName", value=functions["resume"].function_name)
        CfnOutput(self, "AgentLogGroupName", value=self.worker.log_group.log_group_name, description="spotrelay logs")
        # What the dispatcher admits (spotrelay.control.admission.AdmissionLimits, its fields): submit refuses
        # a job this stack could never run, rather than send it to be failed Unschedulable
        CfnOutput(
            self,
            "AdmissionLimits",
            value=json.dumps(
                {
                    "max_concurrent_jobs": config.max_concurrent_jobs,
                    "budget_usd_per_hour": config.budget_usd_per_hour,
                    "spot_vcpu_quotas": config.spot_vcpu_quotas,
                    "allowed_families": list(config.allowed_gpu_families),
                },
                sort_keys=True,
            ),
            description="spotrelay submit checks jobs against these",
        )


def build_scheduler(app: App, config: SpotRelayConfig) -> SchedulerStack:
    """Add the stack to `app` and register the AwsSolutions checks (they run when the app synthesizes)."""
    stack = SchedulerStack(app, config.stack_name, config=config)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return stack
