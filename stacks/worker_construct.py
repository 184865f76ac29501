"""What every GPU worker instance is launched with: launch template, instance role and profile.

The launch function picks the instance type, subnet and market per attempt and tags the request
(`spotrelay:managed`, job id, attempt); everything else comes from this template:
- the Deep Learning AMI (PyTorch, Amazon Linux 2023) from its public SSM parameter, resolved by
  CloudFormation at deploy time (a CloudFormation parameter), never looked up at synth;
- IMDSv2 only, hop limit 1 (a job's container, one hop further, gets no answer; the job's own user
  is rejected by an iptables rule), instance tags in IMDS: that is how the agent learns its job id and
  attempt - user data carries no job data and no secret;
- the instance role reaches no job's data: the agent reads the wheel and invokes vend for its own
  job's credentials (spotrelay.control.vend), with which it reaches its job's records, checkpoints and
  task token and ships its log lines to its job's streams; the job runs as `spotrelay-job`;
- an encrypted gp3 root volume; shutdown from inside the instance terminates it;
- a security group with no inbound rule (operators use SSM Session Manager, not SSH).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from spotrelay.agent import AGENT_UNIT_NAME, JOB_USER, systemd_unit
from spotrelay.config import ENV_AGENT_LOG_GROUP, ENV_BUCKET, ENV_TABLE, ENV_VEND_FUNCTION
from stacks.config import SpotRelayConfig
from stacks.storage_construct import AGENT_PREFIX
from stacks.suppressions import acknowledge, acknowledge_wildcard_resources

ROOT_DEVICE = "/dev/xvda"  # Amazon Linux 2023 AMIs
AGENT_UNIT = AGENT_UNIT_NAME


def agent_log_group_name(stack_name: str) -> str:
    """The worker agents' log group: one per stack (`spotrelay logs` finds it in the stack's outputs)."""
    return f"/spotrelay/{stack_name}/agent"


class Worker(Construct):
    """`launch_template` (and its `launch_template_id`), `role`, `instance_profile`, `security_group`,
    `image_id` (the deploy-time AMI id), `log_group` (the agent's)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: SpotRelayConfig,
        vpc: ec2.IVpc,
        table: dynamodb.ITable,
        bucket: s3.IBucket,
        vend_function_name: str,
    ) -> None:
        super().__init__(scope, id)
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="spotrelay GPU workers: no inbound access; outbound to AWS APIs and package registries",
            allow_all_outbound=True,
        )
        # Named after the stack, so two stacks in one account and region keep their workers' lines apart
        self.log_group = logs.LogGroup(
            self,
            "AgentLogs",
            log_group_name=agent_log_group_name(Stack.of(self).stack_name),
            retention=logs.RetentionDays.ONE_MONTH,
        )
        # The group's own ARN (LogGroup.log_group_arn ends in `:*`): a job's credentials reach its streams
        # within it (spotrelay.control.vend); the instance role writes none of them
        self.log_group_arn = Stack.of(self).format_arn(
            service="logs",
            resource="log-group",
            resource_name=self.log_group.log_group_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="spotrelay worker: the agent wheel, SSM, and invoking vend for its job's credentials",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
        )
        acknowledge(
            self.role,
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            "Session Manager is how operators reach a worker (no SSH key, no inbound port); AWS maintains this "
            "policy's SSM agent permissions as the agent evolves, which a hand-written copy would not track.",
        )
        self._grant_worker_permissions(bucket=bucket)
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)

        image = ec2.MachineImage.from_ssm_parameter(config.worker_ami_ssm_parameter, os=ec2.OperatingSystemType.LINUX)
        self.image_id = image.get_image(self).image_id
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            machine_image=image,
            user_data=_agent_user_data(
                table=table, bucket=bucket, log_group=self.log_group, vend_function_name=vend_function_name
            ),
            instance_profile=self.instance_profile,
            security_group=self.security_group,
            http_endpoint=True,
            http_tokens=ec2.LaunchTemplateHttpTokens.REQUIRED,
            # 1: a container (one more hop, through docker's bridge) gets no answer from IMDS
            http_put_response_hop_limit=1,
            instance_metadata_tags=True,
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        config.worker_root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
            version_description="spotrelay GPU worker",
        )
        if self.launch_template.launch_template_id is None:  # only imported templates lack one
            raise ValueError("the worker launch template has no id")
        self.launch_template_id: str = self.launch_template.launch_template_id

    def _grant_worker_permissions(self, *, bucket: s3.IBucket) -> None:
        # Nothing of any job: the agent gets its own job's credentials from the vend function
        # (stacks/job_credentials_construct grants the invoke). The role keeps what the instance itself needs.
        wheel = iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{AGENT_PREFIX}*")])
        self.role.add_to_principal_policy(wheel)
        acknowledge_wildcard_resources(
            self.role,
            wheel,
            "User data installs the agent from the wheel(s) under agent/, whose file names carry their "
            "versions; read-only, and only that prefix.",
        )


def _agent_user_data(
    *, table: dynamodb.ITable, bucket: s3.IBucket, log_group: logs.ILogGroup, vend_function_name: str
) -> ec2.UserData:
    """Create the job's user, install the agent from the bucket's agent/ wheel and run it as a systemd unit
    (which keeps the job's user away from IMDS: spotrelay.agent.systemd_unit)."""
    user_data = ec2.UserData.for_linux()
    user_data.add_commands(
        "set -euo pipefail",
        "# The job id and attempt are this instance's tags; the agent reads them from IMDS. No secrets here.",
        "dnf install -y -q python3.11 iptables-nft",
        # The job runs as this user: no sudo, no docker group, no way to IMDS (the unit's iptables rule)
        f"id -u {JOB_USER} >/dev/null 2>&1 || useradd --system --create-home --shell /sbin/nologin {JOB_USER}",
        "install -d -m 0755 /opt/spotrelay/wheels",
        f'aws s3 cp --recursive --only-show-errors "s3://{bucket.bucket_name}/{AGENT_PREFIX}" /opt/spotrelay/wheels/',
        "python3.11 -m venv /opt/spotrelay/venv",
        # The wheel file itself, never the name "spotrelay": a package of that name on PyPI must not win.
        "wheel=$(ls /opt/spotrelay/wheels/spotrelay-*.whl | sort -V | tail -n 1)",
        # with the [aws] extra: the agent needs boto3, which the DLAMI's system Python does not lend a venv;
        # [agent]: watchtower, which ships its log lines to the log group
        '/opt/spotrelay/venv/bin/pip install --quiet --find-links /opt/spotrelay/wheels "${wheel}[aws,agent]"',
        f"cat > /etc/systemd/system/{AGENT_UNIT} <<'UNIT'",
        *systemd_unit(
            {
                ENV_TABLE: table.table_name,
                ENV_BUCKET: bucket.bucket_name,
                ENV_AGENT_LOG_GROUP: log_group.log_group_name,
                ENV_VEND_FUNCTION: vend_function_name,
                "AWS_REGION": Aws.REGION,
            }
        ).splitlines(),
        "UNIT",
        "systemctl daemon-reload",
        f"systemctl enable --now {AGENT_UNIT}",
    )
    return user_data
