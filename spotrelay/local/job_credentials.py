"""A replay's instances get their job's credentials the way they do on EC2: from the vend function.

EC2 gives an instance its profile's role as a session named after the instance; here that is an
AssumeRole of the worker role with the instance id as the session name (moto's STS then answers
GetCallerIdentity with `assumed-role/<worker role>/<instance id>`, as AWS does). The agent's code does
the rest: it signs GetCallerIdentity with those credentials, invokes the deployed vend function (its
real handler, in-process), and reaches DynamoDB, S3 and Step Functions with what vend returns. moto
enforces no IAM, so the policies are proved elsewhere (tests/infrastructure/test_job_isolation.py);
here the path itself runs end to end, once per attempt (the credentials last an hour of real time).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import boto3

from spotrelay.aws.vend import VendClient, vended_session
from spotrelay.config import ENV_WORKER_ROLE_ARN

if TYPE_CHECKING:
    from spotrelay.local.deploy import LocalStack
    from spotrelay.local.runtime import LocalRuntime

VEND = "vend"  # the handler module of the vend function (LocalStack.functions' key)


class LocalInstanceCredentials:
    """The instance profile and vend, for the instances of one deployed stack."""

    def __init__(self, runtime: LocalRuntime, stack: LocalStack) -> None:
        self._lambda = runtime.client("lambda")
        self._sts = runtime.client("sts")
        self.region = stack.region
        self.function_name = stack.functions[VEND]
        configuration = self._lambda.get_function_configuration(FunctionName=self.function_name)
        self.worker_role_arn = configuration["Environment"]["Variables"][ENV_WORKER_ROLE_ARN]
        self._models = boto3.session.Session(region_name=self.region)  # loads each service's model once

    def instance_session(self, instance_id: str) -> boto3.session.Session:
        """What the instance profile gives the instance (EC2 names the session after the instance)."""
        own = self._sts.assume_role(RoleArn=self.worker_role_arn, RoleSessionName=instance_id)["Credentials"]
        return boto3.session.Session(
            aws_access_key_id=own["AccessKeyId"],
            aws_secret_access_key=own["SecretAccessKey"],
            aws_session_token=own["SessionToken"],
            region_name=self.region,
        )

    def vend_client(self, instance_id: str) -> VendClient:
        return VendClient(
            instance_session=self.instance_session(instance_id),
            lambda_client=self._lambda,  # who invokes does not matter to moto; the signed identity does
            function_name=self.function_name,
            region=self.region,
        )

    def job_session(self, first: dict[str, str], vend: VendClient) -> boto3.session.Session:
        return vended_session(vend.fetch, self.region, first, models_from=self._models)


_BY_RUNTIME: weakref.WeakKeyDictionary[Any, LocalInstanceCredentials] = weakref.WeakKeyDictionary()


def instance_credentials(runtime: LocalRuntime, stack: LocalStack) -> LocalInstanceCredentials:
    """One per deployed runtime (the function's configuration is read once)."""
    made = _BY_RUNTIME.get(runtime)
    if made is None:
        made = _BY_RUNTIME[runtime] = LocalInstanceCredentials(runtime, stack)
    return made
