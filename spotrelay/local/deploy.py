"""Deploy the synthesized template (cdk.out/<Stack>.template.json, the file `cdk synth` writes) into
moto's CloudFormation, as `cdk deploy` would into an account: the same state machine definition,
rules, environment variables and IAM shape as on AWS, not a hand-written copy of the resources.

Before CreateStack, what a bootstrapped account already has:
- SSM parameters the template resolves at deploy time: `/cdk-bootstrap/hnb659fds/version` (the
  BootstrapVersion rule) and the worker AMI's public parameter (`/aws/service/deeplearning/...`), which
  points at an AMI registered in moto (moto refuses to create `/aws/...` parameters through the API:
  they are seeded in its backend, as AWS publishes them);
- the bootstrap bucket `cdk-hnb659fds-assets-<account>-<region>` holding the assets of
  `<Stack>.assets.json` (the Lambda code directory, zipped; the template itself).

The stack is then created from the template's S3 URL, and what the local runtime needs is read back
into a `LocalStack`. moto needs `spotrelay.local.patches` installed for this template (the models it
lacks, state machines on the executing backend, tagged KMS keys).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import time
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from spotrelay.config import ENV_SUBNETS

DEFAULT_QUALIFIER = "hnb659fds"
BOOTSTRAP_VERSION = "28"
LOCAL_AMI_NAME = "spotrelay-local-worker-ami"
CDK_ENV = {
    "CDK_DISABLE_CLI_TELEMETRY": "1",
    "CDK_DISABLE_VERSION_CHECK": "1",
    "CDK_VALIDATION": "false",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED": "true",  # the Makefile's CDK_ENV says why
}
_SSM_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class DeployError(RuntimeError):
    """The template could not be deployed into moto (the message says what to do)."""


@dataclass(frozen=True)
class LocalStack:
    """What the local runtime (and a user) needs to know about the deployed stack."""

    stack_name: str
    stack_id: str
    region: str
    account_id: str
    queue_url: str
    dlq_url: str
    table_name: str
    bucket_name: str
    state_machine_arn: str
    launch_template_id: str
    functions: Mapping[str, str]  # handler module (dispatcher, place, ...) -> function name
    function_arns: Mapping[str, str]
    subnets: Mapping[str, str]  # availability zone -> subnet id
    alarm_names: tuple[str, ...]
    # The queue-depth alarm: the one alarm an EventBridge rule wakes a function on (the dispatcher), which
    # the replay raises when jobs wait. The dead-letter alarms notify operators only.
    depth_alarm_name: str
    rules: Mapping[str, str]  # logical id -> rule name
    schedule_rules: tuple[str, ...]
    outputs: Mapping[str, str]
    resources: Mapping[str, str] = field(repr=False)  # logical id -> physical id
    deploy_seconds: float = 0.0
    endpoint_url: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -------------------------------------------------------------------------------------------- synth


def template_path(cdk_out: Path, stack_name: str = "SpotRelay") -> Path:
    return cdk_out / f"{stack_name}.template.json"


def synthesize(repo_root: Path, *, timeout: float = 300.0) -> Path:
    """Run `cdk synth` (what `make synth` runs, without cfn-lint) and return cdk.out. Needs the pinned
    CDK CLI in node_modules (`make synth` installs it)."""
    npx = shutil.which("npx")
    if npx is None or not (repo_root / "node_modules").is_dir():
        raise DeployError(f"no synthesized template and no CDK CLI to make one: run `make synth` in {repo_root}")
    result = subprocess.run(
        [npx, "cdk", "synth", "--no-notices", "-q"],
        cwd=repo_root,
        env={**os.environ, **CDK_ENV},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise DeployError(f"cdk synth failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return repo_root / "cdk.out"


# ------------------------------------------------------------------------------------------- deploy


def _substitute(text: str, account_id: str, region: str) -> str:
    return (
        text.replace("${AWS::AccountId}", account_id)
        .replace("${AWS::Region}", region)
        .replace("${AWS::Partition}", "aws")
    )


def zip_directory(directory: Path) -> bytes:
    """The directory as a zip, deterministically (sorted entries, fixed times), uncompressed (fast)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            info = zipfile.ZipInfo(path.relative_to(directory).as_posix(), date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


class _Clients:
    def __init__(self, region: str, endpoint_url: str | None) -> None:
        config = Config(retries={"total_max_attempts": 1})
        kwargs: dict[str, Any] = {"region_name": region, "config": config}
        if endpoint_url:
            kwargs["endpoint_url"] = endpoint_url
        self.s3 = boto3.client("s3", **kwargs)
        self.ssm = boto3.client("ssm", **kwargs)
        self.ec2 = boto3.client("ec2", **kwargs)
        self.sts = boto3.client("sts", **kwargs)
        self.cloudformation: Any = boto3.client("cloudformation", **kwargs)
        self.lambda_ = boto3.client("lambda", **kwargs)
        self.events = boto3.client("events", **kwargs)


def _ensure_bucket(clients: _Clients, bucket: str, region: str) -> None:
    existing = {b["Name"] for b in clients.s3.list_buckets().get("Buckets", [])}
    if bucket in existing:
        return
    if region == "us-east-1":
        clients.s3.create_bucket(Bucket=bucket)
    else:
        clients.s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})  # type: ignore[typeddict-item]


def upload_assets(clients: _Clients, assets_file: Path, account_id: str, region: str) -> dict[str, str]:
    """Upload every file asset of `<Stack>.assets.json` to its bootstrap bucket; returns source path -> s3 URL."""
    manifest = json.loads(assets_file.read_text())
    uploaded: dict[str, str] = {}
    for asset in manifest.get("files", {}).values():
        source = asset["source"]
        path = assets_file.parent / source["path"]
        if not path.exists():
            raise DeployError(f"asset {path} is missing: run `make synth` again")
        body = zip_directory(path) if source.get("packaging") == "zip" and path.is_dir() else path.read_bytes()
        for destination in asset.get("destinations", {}).values():
            bucket = _substitute(destination["bucketName"], account_id, region)
            key = _substitute(destination["objectKey"], account_id, region)
            _ensure_bucket(clients, bucket, region)
            clients.s3.put_object(Bucket=bucket, Key=key, Body=body)
            uploaded[source["path"]] = f"https://s3.{region}.amazonaws.com/{bucket}/{key}"
    return uploaded


def seed_parameters(clients: _Clients, template: Mapping[str, Any], account_id: str, region: str) -> None:
    """Create the SSM parameters the template's `AWS::SSM::Parameter::Value<...>` parameters name."""
    for parameter in template.get("Parameters", {}).values():
        kind = str(parameter.get("Type", ""))
        name = parameter.get("Default")
        if not kind.startswith(_SSM_PARAMETER_TYPE) or not name:
            continue
        if _parameter_exists(clients, name):
            continue
        if "AWS::EC2::Image::Id" in kind:
            value, data_type = _local_ami(clients), "aws:ec2:image"
        elif name.startswith(f"/cdk-bootstrap/{DEFAULT_QUALIFIER}/version"):
            value, data_type = BOOTSTRAP_VERSION, "text"
        else:
            value, data_type = f"local:{name}", "text"
        if name.lower().startswith(("/aws/", "/ssm/")):
            _seed_public_parameter(account_id, region, name, value, data_type)
        else:
            clients.ssm.put_parameter(Name=name, Value=value, Type="String", DataType=data_type)


def _parameter_exists(clients: _Clients, name: str) -> bool:
    try:
        clients.ssm.get_parameter(Name=name)
    except clients.ssm.exceptions.ParameterNotFound:
        return False
    return True


def _local_ami(clients: _Clients) -> str:
    images = clients.ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [LOCAL_AMI_NAME]}])
    if images["Images"]:
        return images["Images"][0]["ImageId"]
    return clients.ec2.register_image(
        Name=LOCAL_AMI_NAME,
        Description="stands in for the Deep Learning AMI (GPU PyTorch) in the local runtime",
        Architecture="x86_64",
        RootDeviceName="/dev/xvda",
        VirtualizationType="hvm",
    )["ImageId"]


def _seed_public_parameter(account_id: str, region: str, name: str, value: str, data_type: str) -> None:
    """AWS publishes /aws/... parameters; moto's API refuses to create them: seed its backend (in-process)."""
    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ssm_backends

    backend = ssm_backends[account_id][region]
    parameter_class: Any = Parameter  # moto's model declares CloudFormation hooks it does not implement
    backend._parameters[name].append(
        parameter_class(
            account_id=account_id,
            name=name,
            value=value,
            parameter_type="String",
            description="public parameter (seeded by spotrelay.local)",
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=1,
            data_type=data_type,
        )
    )


def deploy_template(
    template_file: Path,
    *,
    region: str = "us-east-1",
    stack_name: str | None = None,
    endpoint_url: str | None = None,
) -> LocalStack:
    """Deploy `template_file` (with its assets manifest next to it) into moto; returns the stack's names.
    Raises DeployError with moto's stack events if the stack does not reach CREATE_COMPLETE."""
    if not template_file.is_file():
        raise DeployError(f"{template_file} does not exist: run `make synth` first")
    started = time.perf_counter()
    name = stack_name or template_file.name.removesuffix(".template.json")
    template = json.loads(template_file.read_text())
    clients = _Clients(region, endpoint_url)
    account_id = clients.sts.get_caller_identity()["Account"]
    seed_parameters(clients, template, account_id, region)
    assets_file = template_file.with_name(f"{name}.assets.json")
    uploaded = upload_assets(clients, assets_file, account_id, region) if assets_file.is_file() else {}
    template_url = uploaded.get(template_file.name)
    create: dict[str, Any] = {
        "StackName": name,
        "Capabilities": ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
    }
    if template_url:
        create["TemplateURL"] = template_url
    else:
        create["TemplateBody"] = template_file.read_text()
    cfn = clients.cloudformation
    try:
        stack_id = cfn.create_stack(**create)["StackId"]
    except Exception as e:
        raise DeployError(f"CreateStack {name} failed in moto: {e}") from e
    stack = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        events = cfn.describe_stack_events(StackName=stack_id)["StackEvents"]
        reasons = [
            f"{e.get('LogicalResourceId')}: {e.get('ResourceStatus')} {e.get('ResourceStatusReason', '')}"
            for e in events
            if "FAILED" in str(e.get("ResourceStatus"))
        ]
        raise DeployError(f"stack {name} is {stack['StackStatus']}: " + "; ".join(reasons[:10]))
    local = _describe(clients, template, stack_id, name, region, account_id, endpoint_url)
    return _with_time(local, time.perf_counter() - started)


def _names_alarm(rule: Mapping[str, Any], alarm_logical_id: str) -> bool:
    """Whether the rule's event pattern matches the state changes of that alarm (`detail.alarmName` refers to it)."""
    names = rule.get("EventPattern", {}).get("detail", {}).get("alarmName", [])
    return any(isinstance(name, dict) and name.get("Ref") == alarm_logical_id for name in names)


def _with_time(stack: LocalStack, seconds: float) -> LocalStack:
    return LocalStack(**{**asdict(stack), "deploy_seconds": round(seconds, 3)})


def _describe(
    clients: _Clients,
    template: Mapping[str, Any],
    stack_id: str,
    name: str,
    region: str,
    account_id: str,
    endpoint_url: str | None,
) -> LocalStack:
    cfn = clients.cloudformation
    stack = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", []) if "OutputKey" in o}
    physical: dict[str, str] = {}
    paginator = cfn.get_paginator("list_stack_resources")
    for page in paginator.paginate(StackName=stack_id):
        for summary in page["StackResourceSummaries"]:
            physical[summary["LogicalResourceId"]] = summary.get("PhysicalResourceId", "")
    resources = template.get("Resources", {})

    def of_type(kind: str) -> list[str]:
        return sorted(logical for logical, r in resources.items() if r.get("Type") == kind and logical in physical)

    functions: dict[str, str] = {}
    function_arns: dict[str, str] = {}
    subnets: dict[str, str] = {}
    for logical in of_type("AWS::Lambda::Function"):
        configuration = clients.lambda_.get_function_configuration(FunctionName=physical[logical])
        module = str(configuration.get("Handler", "")).rpartition(".")[0].replace("/", ".").rsplit(".", 1)[-1]
        functions[module] = configuration["FunctionName"]
        function_arns[module] = configuration["FunctionArn"]
        variables = configuration.get("Environment", {}).get("Variables", {})
        if ENV_SUBNETS in variables and not subnets:
            subnets = dict(json.loads(variables[ENV_SUBNETS]))
    rules = {logical: physical[logical] for logical in of_type("AWS::Events::Rule")}
    schedule_rules = tuple(
        physical[logical]
        for logical in of_type("AWS::Events::Rule")
        if "ScheduleExpression" in resources[logical]["Properties"]
    )
    return LocalStack(
        stack_name=name,
        stack_id=stack_id,
        region=region,
        account_id=account_id,
        queue_url=outputs.get("QueueUrl", ""),
        dlq_url=outputs.get("DeadLetterQueueUrl", ""),
        table_name=outputs.get("TableName", ""),
        bucket_name=outputs.get("BucketName", ""),
        state_machine_arn=outputs.get("StateMachineArn", ""),
        launch_template_id=outputs.get("LaunchTemplateId", ""),
        functions=dict(sorted(functions.items())),
        function_arns=dict(sorted(function_arns.items())),
        subnets=dict(sorted(subnets.items())),
        alarm_names=tuple(physical[logical] for logical in of_type("AWS::CloudWatch::Alarm")),
        depth_alarm_name=next(
            (
                physical[logical]
                for logical in of_type("AWS::CloudWatch::Alarm")
                if any(_names_alarm(resources[rule].get("Properties", {}), logical) for rule in rules)
            ),
            "",
        ),
        rules=rules,
        schedule_rules=schedule_rules,
        outputs=outputs,
        resources=physical,
        endpoint_url=endpoint_url,
    )
