"""Every change spotrelay's local runtime makes to moto (pinned: 5.2.5), in one place, with canaries.

moto runs state machines for real, but runs Lambda code only in Docker, delivers EventBridge events
to no Lambda or Step Functions target, waits in real time, and deploys some templates incompletely.
`install(...)` replaces these private moto attributes (and `uninstall()` puts them back):

Lambda and EventBridge
- `StepFunctionResponse.send_task_failure`: the `cause` reaches the execution (stock moto passes the error
  only: a task the agent failed reached Recover without its exit code and last lines).
- `CallbackPoolManager.notify` and `.heartbeat`: a task token whose task has its outcome is closed, and a
  later SendTaskSuccess, SendTaskFailure or heartbeat is TaskTimedOut, as Step Functions answers (stock moto
  accepted it silently).
- `LambdaFunction._invoke_lambda`: the handler runs in-process (`spotrelay.local.lambdas`), with the
  function's environment; errors come back as Lambda's error envelope. Asynchronous (`Event`)
  invocations go through the same method: moto runs them synchronously, in the caller's thread.
- `Rule.send_to_targets`: Lambda targets are invoked (as an asynchronous invocation, with the event in
  AWS's shape: ISO `time`, `account`), Step Functions targets start an execution; other targets keep
  moto's behaviour. Rules that are disabled, or have a schedule and no pattern, match no event (stock
  moto lets a rule without a pattern match every event). A delivery hook (`Installed.delivery_faults`,
  spotrelay.local.chaos) may make a Lambda target's delivery twice, later or never; it patches nothing
  more of moto (its deliveries go through the same `LambdaFunction.invoke`).
- `Replay.replay_events` (StartReplay): only the archived events of the replay's window (EventStartTime to
  EventEndTime, by each event's `time`) are delivered again; stock moto delivers every event in the
  archive, whatever the window. They go through `Rule.send_to_targets` as stock moto sends them (each
  with a new id and its `replay-name`, so the archive's own rule does not archive them again).

The virtual clock (all under moto/stepfunctions/parser/asl/, see `spotrelay.local.clock`)
- `ExecutionWorker.start`: an execution becomes a process of the clock (queued when started, holds
  the clock's baton while it runs, gives it back when it blocks on the clock or ends).
- `WaitFunction._wait_interval` (Wait states) and `Timestamp._get_wait_seconds` (`Timestamp` waits
  against the clock's now): sleep on the clock; a stop or end of the execution interrupts the sleep.
- `retrier_decl.time`: Retry intervals (`time.sleep(interval)`) sleep on the clock.
- `callback.Event`: task tokens (`.waitForTaskToken`), their HeartbeatSeconds and TimeoutSeconds wait
  on clock events (a timeout is in virtual seconds).
- `Environment.__init__`: the execution's `program_state_event` is a clock event (what interrupts Waits).

CloudFormation (the synthesized template)
- models for AWS::CloudWatch::Alarm, AWS::SQS::QueuePolicy, AWS::S3::BucketPolicy, AWS::CDK::Metadata
  (`spotrelay.local.cfn_models`);
- `StateMachine.create/update/delete_from_cloudformation_json`: state machines go to the backend the
  API uses (the executing one), so that StartExecution on the stack's ARN runs the definition;
- `Key.create_from_cloudformation_json`: CloudFormation's `Tags` ({Key, Value}) are KMS's {TagKey, TagValue}
  (stock moto raises KeyError 'TagKey' on a tagged key).
- `FlowLogs.create_from_cloudformation_json`: an S3 destination with a key prefix
  (`arn:aws:s3:::bucket/prefix/`) keeps the bucket only (stock moto looks `bucket/prefix/` up as a bucket,
  fails, and raises IndexError); the flow log records nothing anyway.
- `CloudFormationBackend.delete_change_set` and `.describe_change_set`: a change set that is not there is
  not deleted (stock moto raises UnboundLocalError, a 500) and is ChangeSetNotFound (stock moto says "Stack
  with id <name> does not exist"): what the CDK CLI asks about its previous change set before an update.
- `Stack.stack_parameters`: an `AWS::SSM::Parameter::Value<...>` parameter's previous value is its SSM name
  (stock moto gave the resolved value, which an update with UsePreviousValue then looked up as a name).
- `ChangeSet.apply`: executing a change set (what `cdk deploy` does) gives the stack its new template's
  outputs too (stock moto updates only the resources: a stack `cdk deploy` created had no outputs).
- `Archive.create_from_cloudformation_json`: the name moto generates (`<stack>-<logical id>-<suffix>`) is
  cut to EventBridge's 48 characters, and the `EventPattern` object is passed as the JSON text moto parses.

S3
- `FakeBucket.get_permission`: a bucket policy's statements with a `Condition` are left out of the
  evaluation. moto evaluates bucket policies without their conditions, so the template's TLS-only
  Deny statements (`aws:SecureTransport: false`, `s3:TlsVersion < 1.2`) would deny every request;
  every client here uses HTTPS, which AWS would let through.

EC2
- `moto.settings.ec2_load_default_amis` (moto's MOTO_EC2_LOAD_DEFAULT_AMIS): False, so an EC2 backend is made
  without moto's 10,000 public AMIs (half a second each); the workers boot the AMI the deploy registers.
- Only with a market (`spotrelay.local.ec2_market`): `InstanceResponse.run_instances` and
  `SpotInstances.describe_spot_price_history` answer from the market; catalog GPU types moto lacks are
  added to its instance-type tables.

Speed (the same answers, less work: a replay makes thousands of calls and moto's generic response
serializer was most of their cost)
- `BaseJSONSerializer._serialize_type_structure`: a DynamoDB `AttributeValue` ({"S": ...}, {"M": ...},
  ...) becomes its wire JSON directly; the generic path asks the value picker for each of the shape's ten
  members at every level of every item (most of a large GetItem's time went there). Anything
  else, or an attribute value of a shape this does not know, takes moto's path.
- `moto.core.responses.method_names_from_class`: remembered per class (`inspect.getmembers` over the
  whole response class at every request).
- `moto.kms.models.generate_private_key`: a KMS key's RSA private key (which moto makes for every key, a
  symmetric one too: 80 ms each, five per deploy) is generated at its first use (Sign, Verify, GetPublicKey).
- `AttributePicker.__call__`: the keys the serializer's alias providers offer for a member are
  remembered per (object class and `Meta`, key, shape); a DescribeInstances asked them thousands of times.
  A picker's response transformers still apply to the value found, as moto applies them.
- `jsonpath_ng.ext.parse` (and the names moto's Step Functions imported it under, with
  `jsonpath_ng.parse`): a path's text is parsed once (each call built the PLY parser's tables anew).
- `dynamodb Table.query` and `.all_items`: a Query's candidates are its partition's items (an index
  Query: the items whose index hash attributes match), not every item of the table sorted.
- botocore's `session.create_loader`: one data loader per search path for every session (each new session
  decoded the service models' JSON again for its first client); the shared loader's search
  paths ignore the duplicate each boto3 Session appends.
- `lambda_eval_utils.boto_client_for`: a Lambda task's client, one per region and service (moto made one per
  task, always with the same fixed keys).
- botocore's `SigV4Auth.canonical_request` and `.signature`: requests carry a fixed signature under the
  real credential scope; moto checks no signature, it reads the account and region from the scope.

Executions left behind
- moto forgets an execution's backend on reset, not its threads: an execution that an earlier mock in
  this process left running (a test's, a stopped server's) wakes when its real-time Wait, Retry or
  heartbeat timeout ends, and would run its next states under these patches, against whatever is
  mocked now (its Lambda calls reach the functions of the same name; its waits take the new clock's
  baton from the process that holds it). `install` stops every such execution first (found through
  `gc`, `ExecutionWorker.stop`): a stopped execution runs no further state. It cannot tell a leftover
  from an execution of a plain moto mock still in use in the same process, so a local runtime is not
  to be started inside another live mock (none of spotrelay's commands or tests does).

`check_moto()` compares each patched attribute's signature (and, where the patch depends on a line
of moto's body, that line) with what this module was written against; `install` refuses to run on
any difference, naming it.
"""

from __future__ import annotations

import copy
import gc
import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any, Protocol, cast

import jsonpath_ng
import jsonpath_ng.ext
import moto
from botocore import session as botocore_session
from botocore.auth import SigV4Auth
from moto.awslambda.models import LambdaFunction
from moto.cloudformation.exceptions import CloudFormationError
from moto.cloudformation.exceptions import ValidationError as CfnValidationError
from moto.cloudformation.models import ChangeSet, CloudFormationBackend
from moto.cloudformation.models import Stack as CfnStack
from moto.core import responses as moto_responses
from moto.core import serialize as moto_serialize
from moto.core.constants import MISSING as MOTO_MISSING
from moto.core.responses import EmptyResult
from moto.core.serialize import AttributePicker, AttributePickerContext, BaseJSONSerializer
from moto.core.utils import get_value as moto_get_value
from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX as DYNAMODB_ERROR_PREFIX
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table as DynamoTable
from moto.dynamodb.responses import DynamoHandler
from moto.ec2.models import instance_types as moto_instance_types
from moto.ec2.models.amis import AmiBackend
from moto.ec2.models.flow_logs import FlowLogs, FlowLogsBackend
from moto.ec2.responses.instances import InstanceResponse
from moto.ec2.responses.spot_instances import SpotInstances
from moto.events.models import Archive, Rule
from moto.events.models import Replay as EventsReplay
from moto.kms import models as moto_kms_models
from moto.kms.models import Key
from moto.s3.models import FakeBucket
from moto.sqs import models as moto_sqs_models
from moto.stepfunctions import responses as sfn_responses
from moto.stepfunctions.models import StateMachine
from moto.stepfunctions.parser.api import TaskTimedOut as SfnTaskTimedOut
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEventException
from moto.stepfunctions.parser.asl.component.common.path import result_path as sfn_result_path
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils as sfn_lambda_eval
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.timestamp import Timestamp
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.asl.eval import environment as sfn_environment
from moto.stepfunctions.parser.asl.eval.callback import callback
from moto.stepfunctions.parser.asl.parse import asl_parser
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.asl.utils import json_path as sfn_json_path
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker
from moto.stepfunctions.parser.models import StepFunctionsParserBackend

from spotrelay.local import cfn_models
from spotrelay.local.clock import SimulationClock
from spotrelay.local.ec2_market import (
    Ec2Market,
    instance_type_entry,
    missing_instance_types,
    sibling_offerings,
)
from spotrelay.local.lambdas import InProcessLambdas, LambdaFunctionLike

logger = logging.getLogger(__name__)

MOTO_VERSION = "5.2.5"
ARCHIVE_NAME_MAX = 48  # EventBridge's limit on archive names


# ------------------------------------------------------------------------------------------- canaries


@dataclass(frozen=True)
class Expected:
    """What a patched moto attribute looked like when the patch was written."""

    owner: Any  # class or module
    name: str
    signature: str | None  # str(inspect.signature(...)); None for a non-callable attribute
    body_lines: tuple[str, ...] = ()  # lines of moto's source the patch depends on (stripped)

    @property
    def where(self) -> str:
        owner = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))
        module = getattr(self.owner, "__module__", None) or getattr(self.owner, "__name__", "")
        return f"{module}.{owner}.{self.name}" if module != owner else f"{owner}.{self.name}"


_SFN_ENV = "moto.stepfunctions.parser.asl.eval.environment.Environment"

EXPECTED: tuple[Expected, ...] = (
    Expected(LambdaFunction, "_invoke_lambda", "(self, event: 'str | None' = None) -> 'tuple[str, bool, str]'"),
    Expected(  # the response handler passes the error only; the executing backend takes the cause too
        sfn_responses.StepFunctionResponse,
        "send_task_failure",
        "(self) -> moto.core.responses.ActionResult",
        ("self.stepfunction_backend.send_task_failure(task_token, error=error)",),
    ),
    Expected(  # an endpoint keeps its outcome once answered, and is notified again by a later answer
        callback.CallbackPoolManager,
        "notify",
        "(self, callback_id: str, outcome: moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome) "
        "-> bool",
        ("callback_endpoint.notify(outcome=outcome)",),
    ),
    Expected(callback.CallbackPoolManager, "heartbeat", "(self, callback_id: str) -> bool"),
    Expected(
        callback.CallbackEndpoint,
        "get_outcome",
        "(self) -> moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome | None",
    ),
    Expected(
        SfnTaskTimedOut,
        "__init__",
        "(self, message: str, exception_type: str | None = None, status: int | None = None)",
    ),
    Expected(
        StepFunctionsParserBackend,
        "send_task_failure",
        "(self, task_token: str, error: str = None, cause: str = None) -> "
        "moto.stepfunctions.parser.api.SendTaskFailureOutput",
    ),
    Expected(  # the replay's window: the events it delivers are `archive.events`, its times the request's
        EventsReplay,
        "replay_events",
        "(self, archive: 'Archive') -> 'None'",
        ("for event in archive.events:",),
    ),
    Expected(
        EventsReplay,
        "__init__",
        "(self, account_id: 'str', region_name: 'str', name: 'str', description: 'str', source_arn: 'str', "
        "start_time: 'str', end_time: 'str', destination: 'dict[str, Any]')",
        ("self.event_start_time = start_time", "self.event_end_time = end_time"),
    ),
    Expected(
        LambdaFunction,
        "invoke",
        "(self, body: 'str', request_headers: 'Any', response_headers: 'Any') -> 'str | bytes'",
        ("res, errored, logs = self._invoke_lambda(event=body)",),
    ),
    Expected(
        Rule, "send_to_targets", "(self, original_event: 'EventMessageType', transform_input: 'bool' = True) -> 'None'"
    ),
    Expected(
        ExecutionWorker,
        "start",
        "(self)",
        ("execution_logic_thread = Thread(target=self._execution_logic, daemon=True)",),
    ),
    Expected(ExecutionWorker, "_execution_logic", "(self)"),
    Expected(
        ExecutionWorker,
        "stop",
        "(self, stop_date: datetime.datetime, error: str | None, cause: str | None)",
        ("self.env.set_stop(stop_date=stop_date, cause=cause, error=error)",),
    ),
    Expected(
        WaitFunction,
        "_wait_interval",
        f"(self, env: {_SFN_ENV}, wait_seconds: int) -> None",
        ("env.program_state_event.wait(wait_seconds)",),
    ),
    Expected(
        Timestamp,
        "_get_wait_seconds",
        f"(self, env: {_SFN_ENV}) -> int",
        ("delta = timestamp - datetime.datetime.now()",),
    ),
    Expected(
        retrier_decl.RetrierDecl,
        "_eval_body",
        "(self, env: 'Environment') -> 'None'",
        ("time.sleep(interval_seconds)",),
    ),
    Expected(retrier_decl, "time", None),
    Expected(
        callback.HeartbeatEndpoint,
        "clear_and_wait",
        "(self) -> bool",
        ("return self._next_heartbeat_event.wait(timeout=self._heartbeat_seconds)",),
    ),
    Expected(
        callback.CallbackEndpoint,
        "wait",
        "(self, timeout: float | None = None) -> "
        "moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome | None",
        ("self._notify_event.wait(timeout=timeout)",),
    ),
    Expected(callback.CallbackEndpoint, "__init__", "(self, callback_id: str)", ("self._notify_event = Event()",)),
    Expected(
        callback.HeartbeatEndpoint,
        "__init__",
        "(self, heartbeat_seconds: int)",
        ("self._next_heartbeat_event = Event()",),
    ),
    Expected(callback, "Event", None),
    Expected(
        sfn_environment.Environment,
        "__init__",
        "(self, aws_execution_details: 'AWSExecutionDetails', execution_type: 'StateMachineType', "
        "context: 'ContextObjectData', event_history_context: 'EventHistoryContext', "
        "cloud_watch_logging_session: 'CloudWatchLoggingSession | None', activity_store: 'dict[Arn, Activity]', "
        "variable_store: 'VariableStore | None' = None, mock_test_case: 'MockTestCase | None' = None)",
        ("self.program_state_event = threading.Event()",),
    ),
    Expected(
        StateMachine,
        "create_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str', "
        "**kwargs: 'Any') -> 'StateMachine'",
        ("sf_backend = stepfunctions_backends[account_id][region_name]",),
    ),
    Expected(
        StateMachine,
        "update_from_cloudformation_json",
        "(cls, original_resource: 'Any', new_resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', "
        "region_name: 'str') -> 'StateMachine'",
    ),
    Expected(
        StateMachine,
        "delete_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str') -> 'None'",
    ),
    Expected(
        sfn_responses,
        "get_backend",
        "(account: str, region: str) -> moto.stepfunctions.models.StepFunctionBackend",
        ('if sfn_config.get("execute_state_machine", False):',),
    ),
    Expected(
        Key,
        "create_from_cloudformation_json",
        "(cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any) "
        "-> 'Key'",
        ('tags=properties.get("Tags", []),',),
    ),
    Expected(
        FlowLogs,
        "create_from_cloudformation_json",
        "(cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any) "
        "-> 'FlowLogs'",
        ("flow_log[0].add_tag(tag_key, tag_value)",),
    ),
    Expected(
        FlowLogsBackend,
        "create_flow_logs",
        "(self, resource_type: str, resource_ids: list[str], traffic_type: str, deliver_logs_permission_arn: str, "
        "log_destination_type: str, log_destination: str, log_group_name: str, log_format: str, "
        "max_aggregation_interval: int) -> tuple[list[moto.ec2.models.flow_logs.FlowLogs], list[typing.Any]]",
        ('arn = log_destination.split(":", 5)[5]',),
    ),
    Expected(
        Archive,
        "create_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str', "
        "**kwargs: 'Any') -> 'Archive'",
        ('event_pattern = properties.get("EventPattern")',),
    ),
    Expected(
        FakeBucket,
        "get_permission",
        "(self, action: 'str', resource: 'str') -> 'Any'",
        ("iam_policy = IAMPolicy(self.policy.decode())",),
    ),
    Expected(
        BaseJSONSerializer,
        "_serialize_type_structure",
        "(self, serialized: 'Serialized', value: 'Any', shape: 'StructureShape', key: 'str') -> 'None'",
        ("super()._serialize_type_structure(serialized, value, shape, key)",),
    ),
    Expected(moto_responses, "method_names_from_class", "(clazz: 'object') -> 'list[str]'"),
    Expected(moto.settings, "ec2_load_default_amis", "() -> bool"),
    Expected(  # the setting is read when an EC2 backend is made
        AmiBackend,
        "_load_amis",
        "(self) -> 'None'",
        ('if "MOTO_AMIS_PATH" not in os.environ and not settings.ec2_load_default_amis():',),
    ),
    Expected(  # every KMS key, a symmetric one too, gets its signing key at its creation
        moto_kms_models,
        "generate_private_key",
        "(key_spec: str) -> moto.kms.utils.AbstractPrivateKey",
    ),
    Expected(
        Key,
        "__init__",
        "(self, policy: str | None, key_usage: str, key_spec: str, description: str, account_id: str, region: str, "
        "multi_region: bool = False, origin: str = 'AWS_KMS')",
        ("self.private_key = generate_private_key(self.key_spec)",),
    ),
    Expected(  # the keys the picker tries depend on the object's class, the key and the shape only
        AttributePicker,
        "__call__",
        "(self, context: 'AttributePickerContext') -> 'Any'",
        (
            "for possible_key in self.get_possible_keys(context):",
            'key_path = f"{context.key_path}.{context.key}"',
            "for transform_path, transform in self.response_transformers.items():",
            "if key_path.endswith(transform_path):",
            "value = transform(value)",
        ),
    ),
    Expected(  # each alias provider reads only these of the object: its Meta and its class's name
        moto_serialize,
        "DEFAULT_ALIAS_PROVIDERS",
        None,
    ),
    Expected(jsonpath_ng.ext, "parse", "(path: 'str', debug: 'bool | None' = None) -> 'JSONPath'"),
    Expected(sfn_json_path, "parse", "(path: 'str', debug: 'bool | None' = None) -> 'JSONPath'"),
    Expected(sfn_result_path, "parse", "(string: 'str') -> 'JSONPath'"),
    Expected(  # botocore, not moto: a local request's signature is never checked
        SigV4Auth,
        "add_auth",
        "(self, request)",
        (
            "canonical_request = self.canonical_request(request)",
            "signature = self.signature(string_to_sign, request)",
        ),
    ),
    Expected(SigV4Auth, "canonical_request", "(self, request)"),
    Expected(  # botocore: a session's loader is made by this module-level name, on first use
        botocore_session.Session,
        "_register_data_loader",
        "(self)",
        ("lambda: create_loader(self.get_config_variable('data_path')),",),
    ),
    Expected(botocore_session, "create_loader", "(search_path_string=None)"),
    Expected(  # moto's Lambda tasks ask this name (imported into the module) for their client
        sfn_lambda_eval,
        "_invoke_lambda_function",
        None,
        ("lambda_client = boto_client_for(", 'service="lambda", region=region, state_credentials=state_credentials'),
    ),
    Expected(
        sfn_lambda_eval,
        "boto_client_for",
        "(region: str, service: str, state_credentials: Any = None) -> botocore.client.BaseClient",
        ('aws_access_key_id="ak",', 'aws_secret_access_key="sk",'),
    ),
    Expected(  # a query reads its candidates from all_items() and sorts them itself afterwards
        DynamoTable,
        "query",
        "(self, hash_key: moto.dynamodb.models.dynamo_type.DynamoType | None, range_comparison: str | None, "
        "range_objs: list[moto.dynamodb.models.dynamo_type.DynamoType], limit: int, "
        "exclusive_start_key: dict[str, typing.Any], scan_index_forward: bool, "
        "projection_expressions: list[list[str]] | None, index_name: str | None = None, "
        "consistent_read: bool = False, filter_expression: Any = None, hash_key_conditions: list[tuple[str, "
        "moto.dynamodb.models.dynamo_type.DynamoType]] | None = None, range_key_conditions: list[tuple[str, "
        "str, list[moto.dynamodb.models.dynamo_type.DynamoType]]] | None = None, "
        "**filter_kwargs: Any) -> tuple[list[moto.dynamodb.models.dynamo_type.Item], int, dict[str, "
        "typing.Any] | None]",
        (
            "for item in self.all_items():",
            "possible_results = self.sorted_items(",
            "possible_results.sort(key=lambda item: item.range_key)  # type: ignore",
            "if isinstance(item, Item) and item.hash_key == hash_key",
        ),
    ),
    Expected(DynamoTable, "all_items", "(self) -> list[moto.dynamodb.models.dynamo_type.Item]"),
    Expected(SigV4Auth, "signature", "(self, string_to_sign, request)"),
    Expected(  # a change set's execution updates the stack's resources only (not its outputs)
        ChangeSet,
        "apply",
        "(self) -> 'None'",
        ("self.stack.resource_map.update(self.template_dict, self.parameters)",),
    ),
    Expected(CfnStack, "_create_output_map", "(self) -> 'OutputMap'"),
    Expected(  # the resolved parameters: an SSM-typed one's value, not its name
        CfnStack, "stack_parameters", None, ("return self.resource_map.resolved_parameters",)
    ),
    Expected(  # a name not found leaves `to_delete` unbound
        CloudFormationBackend,
        "delete_change_set",
        "(self, change_set_name: 'str') -> 'None'",
        ("if self.change_sets[cs].change_set_name == change_set_name:", "del self.change_sets[to_delete]"),
    ),
    Expected(  # a name not found raises the stack's ValidationError
        CloudFormationBackend,
        "describe_change_set",
        "(self, change_set_name: 'str') -> 'ChangeSet | None'",
        ("raise ValidationError(change_set_name)",),
    ),
    Expected(  # a JSON template read as JSON (PyYAML's pure-Python loader was most of every deploy)
        CfnStack,
        "parse_template",
        "(template: 'str') -> 'dict[str, Any]'",
        ("return yaml.load(template, Loader=yaml.Loader)", "return json.loads(template)"),
    ),
    Expected(  # parsed once per definition; each execution still gets its own program from the tree
        asl_parser.AmazonStateLanguageParser,
        "parse",
        "(definition: str) -> tuple[moto.stepfunctions.parser.asl.component.eval_component.EvalComponent, "
        "antlr4.ParserRuleContext.ParserRuleContext]",
        ("tree = parser.state_machine()", "preprocessor = Preprocessor()", "program = preprocessor.visit(tree)"),
    ),
    # a chaos seed's DynamoDB faults are injected as moto handles a write (StoreFaults)
    Expected(
        DynamoHandler, "put_item", "(self) -> moto.core.responses.ActionResult", ('name = self.body["TableName"]',)
    ),
    Expected(DynamoHandler, "update_item", "(self) -> moto.core.responses.ActionResult", ('key = self.body["Key"]',)),
    Expected(InstanceResponse, "run_instances", "(self) -> moto.core.responses.ActionResult"),
    Expected(  # the market tells the replay's instances when the control plane terminates them
        InstanceResponse,
        "terminate_instances",
        "(self) -> moto.core.responses.ActionResult",
        ('instance_ids = self._get_param("InstanceIds", [])',),
    ),
    Expected(SpotInstances, "describe_spot_price_history", "(self) -> moto.core.responses.ActionResult"),
    # SQS message visibility and delays on the virtual clock (every other use of time in moto.sqs stays real)
    Expected(moto_sqs_models, "unix_time_millis", "(dt: 'datetime.datetime | None' = None) -> 'float'"),
    Expected(
        moto_sqs_models.Message,
        "change_visibility",
        "(self, visibility_timeout: int) -> None",
        ("self.visible_at = unix_time_millis() + visibility_timeout_msec",),
    ),
    Expected(
        moto_sqs_models.SQSBackend,
        "is_message_valid_based_on_retention_period",
        "(self, queue_name: str, message: moto.sqs.models.Message) -> bool",
        ("retain_until = retention_period + message.sent_timestamp / 1000  # type: ignore",),
    ),
    Expected(moto_instance_types, "INSTANCE_TYPES", None),
    Expected(moto_instance_types, "INSTANCE_TYPE_OFFERINGS", None),
    Expected(moto_instance_types.InstanceTypeBackend, "instance_types", None),
    Expected(moto_instance_types.InstanceType, "__init__", "(self, name: str)", ("self.update(INSTANCE_TYPES[name])",)),
)


class MotoChanged(RuntimeError):
    """moto is not the version spotrelay.local patches: upgrading moto needs these patches revisited."""


def _unwrapped(owner: Any, name: str) -> Any:
    """The attribute as moto defines it (classmethods and staticmethods unwrapped, a property's getter)."""
    raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else getattr(owner, name)
    if isinstance(raw, property):
        return raw.fget
    return raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw


def moto_differences(expectations: Sequence[Expected] = EXPECTED) -> list[str]:
    """Every way moto differs from what the patches expect (empty: safe to patch)."""
    problems = []
    if moto.__version__ != MOTO_VERSION:
        problems.append(f"moto {moto.__version__} is installed; spotrelay.local patches moto {MOTO_VERSION}")
    for expected in expectations:
        target = _ORIGINALS.get((id(expected.owner), expected.name))
        if target is None:
            try:
                target = _unwrapped(expected.owner, expected.name)
            except AttributeError:
                problems.append(f"{expected.where}: missing")
                continue
        if expected.signature is not None:
            try:
                signature = str(inspect.signature(target))
            except (TypeError, ValueError):
                problems.append(f"{expected.where}: not a function any more")
                continue
            if signature != expected.signature:
                problems.append(f"{expected.where}: signature {signature} (expected {expected.signature})")
        if expected.body_lines:
            try:
                source_lines = {line.strip() for line in inspect.getsource(target).splitlines()}
            except (OSError, TypeError):
                problems.append(f"{expected.where}: source not available")
                continue
            problems.extend(
                f"{expected.where}: no longer contains {line!r}"
                for line in expected.body_lines
                if line not in source_lines
            )
    return problems


def check_moto() -> None:
    """Raise MotoChanged, naming every difference, unless moto is exactly what the patches expect."""
    problems = moto_differences()
    if problems:
        raise MotoChanged("spotrelay.local cannot patch this moto:\n  " + "\n  ".join(problems))


# -------------------------------------------------------------------------------------------- patching

_ORIGINALS: dict[tuple[int, str], Any] = {}  # the unpatched attributes while installed (for the canary)
_install_lock = threading.Lock()
_installed: Installed | None = None


class _Patcher:
    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    @staticmethod
    def original(owner: Any, name: str) -> Any:
        """The attribute as it is now (unwrapped from classmethod/staticmethod)."""
        return _unwrapped(owner, name)

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """Set owner.name = value, until `undo`."""
        raw = owner.__dict__[name] if inspect.isclass(owner) else getattr(owner, name)
        key = (id(owner), name)
        _ORIGINALS.setdefault(key, _unwrapped(owner, name))

        def restore() -> None:
            setattr(owner, name, raw)
            _ORIGINALS.pop(key, None)

        self._undo.append(restore)
        setattr(owner, name, value)

    def replace_contents(self, target: dict[str, Any], contents: dict[str, Any]) -> None:
        """Change a dict in place (moto's modules import some by name), until `undo`."""
        saved = dict(target)

        def restore() -> None:
            target.clear()
            target.update(saved)

        self._undo.append(restore)
        target.clear()
        target.update(contents)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@dataclass(frozen=True)
class Undeliverable:
    """What EventBridge does with an event it could not deliver to a target after every retry of its
    RetryPolicy (MaximumRetryAttempts, MaximumEventAgeInSeconds; EventBridge's defaults are 185 and 24 h):
    `give_up()` sends it to the target's DeadLetterConfig queue, as AWS does, or drops it when the target has
    none (as AWS does: every target of the stack has one, tests/infrastructure/test_event_targets.py).
    `after_seconds`: when, at the latest, after the first try (the retries' backoff is not modelled)."""

    give_up: Callable[[str, str], None]  # (ERROR_CODE, ERROR_MESSAGE)
    after_seconds: float


class DeliveryFaults(Protocol):
    """What happens to an EventBridge delivery to a Lambda target instead of its being made once, now
    (spotrelay.local.chaos). `send()` makes it (and records it in `deliveries`) and returns the function
    error, if any; the hook may call it now, later on the clock, more than once, or never; a delivery it
    never makes it gives up on with `undeliverable.give_up` (the target DLQ)."""

    def deliver(
        self,
        rule: str,
        target_arn: str,
        event: Mapping[str, Any],
        send: Callable[[], str | None],
        undeliverable: Undeliverable,
    ) -> None: ...


STORE_THROTTLED = "throttled"
STORE_CONFLICT = "conflict"


class StoreFaults(Protocol):
    """Whether one DynamoDB write (PutItem, UpdateItem: `request` is its JSON body) meets a fault as moto
    is about to handle it (spotrelay.local.chaos): STORE_THROTTLED, answered with
    ProvisionedThroughputExceededException (which an SDK with retries retries, with backoff); STORE_CONFLICT, a
    concurrent writer that got there first: the item's version moves on, so a write conditioned on the
    version it read fails its condition for real and the writer reads again; None, no fault."""

    def store_fault(self, operation: str, request: Mapping[str, Any]) -> str | None: ...


@dataclass
class Installed:
    """The patches in force; `uninstall()` restores moto."""

    clock: SimulationClock
    lambdas: InProcessLambdas
    market: Ec2Market | None
    deliveries: list[Delivery]
    _patcher: _Patcher
    delivery_faults: DeliveryFaults | None = None  # Lambda targets' deliveries go through it when set
    store_faults: StoreFaults | None = None  # DynamoDB writes go through it when set

    def uninstall(self) -> None:
        global _installed
        with _install_lock:
            self._patcher.undo()
            if _installed is self:
                _installed = None


@dataclass(frozen=True)
class Delivery:
    """An event EventBridge delivered to a Lambda or Step Functions target (for diagnostics)."""

    rule: str
    target_arn: str
    event_id: str
    error: str | None


def installed() -> Installed | None:
    return _installed


def install(clock: SimulationClock, lambdas: InProcessLambdas, market: Ec2Market | None = None) -> Installed:
    """Patch moto (see the module docstring). One installation at a time."""
    global _installed
    with _install_lock:
        if _installed is not None:
            raise RuntimeError("spotrelay.local patches are installed already: uninstall them first")
        check_moto()
        stopped = stop_stray_executions()
        if stopped:
            logger.info("stopped executions an earlier mock left running", extra={"executions": stopped})
        patcher = _Patcher()
        deliveries: list[Delivery] = []
        try:
            _patch_lambda(patcher, lambdas)
            _patch_task_failure(patcher)
            _patch_events(patcher, deliveries)
            _patch_clock(patcher, clock)
            _patch_sqs_clock(patcher, clock)
            _patch_cloudformation(patcher)
            _patch_s3(patcher)
            _patch_dynamodb_faults(patcher)
            _patch_speed(patcher)
            _patch_default_amis(patcher)
            if market is not None:
                _patch_ec2(patcher, market)
        except BaseException:
            patcher.undo()
            raise
        _installed = Installed(clock=clock, lambdas=lambdas, market=market, deliveries=deliveries, _patcher=patcher)
        return _installed


def stop_stray_executions() -> int:
    """Stop every Step Functions execution still running in this process (see the module docstring:
    executions left behind); returns how many. Called with no patches installed."""
    stopped = 0
    now = datetime.now(UTC)
    for candidate in gc.get_objects():
        if not isinstance(candidate, ExecutionWorker):
            continue
        env = getattr(candidate, "env", None)
        if env is not None and env.is_running():
            candidate.stop(stop_date=now, error="spotrelay.local.Stale", cause="left running by an earlier mock")
            stopped += 1
    return stopped


# --- Lambda ------------------------------------------------------------------------------------------


def _patch_task_failure(patcher: _Patcher) -> None:
    """SendTaskFailure keeps its `cause`, as Step Functions does: moto's response handler passed only the error
    on, so a task failed by the agent (JobFailed with the exit code and the job's last lines) reached Recover
    with no cause, and `status` said "exited with code None"."""

    def send_task_failure(self: sfn_responses.StepFunctionResponse) -> Any:
        task_token = self._get_param("taskToken")
        backend: Any = self.stepfunction_backend
        backend.send_task_failure(task_token, error=self._get_param("error"), cause=self._get_param("cause"))
        return EmptyResult()

    patcher.replace(sfn_responses.StepFunctionResponse, "send_task_failure", send_task_failure)

    # A token whose task has its outcome is closed: Step Functions answers TaskTimedOut ("the task associated
    # with the token has already been closed") to a later SendTaskSuccess, SendTaskFailure or heartbeat. moto
    # kept the token open and took the second answer silently, so an agent reporting after ec2_events had
    # failed its task (a warning handled before the agent's next IMDS poll) believed it had been heard
    pool = callback.CallbackPoolManager
    original_notify: Callable[..., bool] = patcher.original(pool, "notify")
    original_heartbeat: Callable[..., bool] = patcher.original(pool, "heartbeat")

    def refuse_if_answered(manager: Any, callback_id: str) -> None:
        # (raised here with its code: the backend's own `TaskTimedOut()` lacks the message it needs)
        endpoint = manager.get(callback_id)
        if endpoint is not None and endpoint.consumer_error is None and endpoint.get_outcome() is not None:
            raise SfnTaskTimedOut("Task Timed Out: 'Provided task does not exist anymore'", "TaskTimedOut", 400)

    def notify(self: Any, callback_id: str, outcome: Any) -> bool:
        refuse_if_answered(self, callback_id)
        return original_notify(self, callback_id, outcome)

    def heartbeat(self: Any, callback_id: str) -> bool:
        refuse_if_answered(self, callback_id)
        return original_heartbeat(self, callback_id)

    patcher.replace(pool, "notify", notify)
    patcher.replace(pool, "heartbeat", heartbeat)


def _patch_lambda(patcher: _Patcher, lambdas: InProcessLambdas) -> None:
    def _invoke_lambda(self: LambdaFunction, event: str | None = None) -> tuple[str, bool, str]:
        return lambdas.invoke(cast(LambdaFunctionLike, self), event)

    patcher.replace(LambdaFunction, "_invoke_lambda", _invoke_lambda)


# --- EventBridge -------------------------------------------------------------------------------------


def _event_time(value: Any) -> str:
    if isinstance(value, int | float) or (isinstance(value, str) and value.replace(".", "", 1).isdigit()):
        return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def aws_event(message: dict[str, Any]) -> dict[str, Any]:
    """moto's internal event message as EventBridge delivers it to a target."""
    keys = ("version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail")
    event = {key: copy.deepcopy(message.get(key)) for key in keys}
    event["version"] = event["version"] or "0"
    event["resources"] = event["resources"] or []
    event["time"] = _event_time(message.get("time"))
    return event


def _target_input(target: dict[str, Any], event: dict[str, Any]) -> Any:
    """What a target receives: the event, or its Input / InputPath / InputTransformer."""
    if target.get("Input") is not None:
        return json.loads(target["Input"])
    if target.get("InputPath"):
        value: Any = event
        for part in str(target["InputPath"]).removeprefix("$").strip(".").split("."):
            if part:
                value = value.get(part) if isinstance(value, dict) else None
        return value
    transformer = target.get("InputTransformer")
    if transformer:
        from moto.events.utils import EventTemplateParser

        return EventTemplateParser.parse(
            input_template=transformer.get("InputTemplate"),
            input_paths_map=transformer.get("InputPathsMap", {}),
            event=cast(Any, event),
        )
    return event


def _patch_events(patcher: _Patcher, deliveries: list[Delivery]) -> None:
    original: Callable[..., None] = patcher.original(Rule, "send_to_targets")

    def send_to_targets(self: Rule, original_event: dict[str, Any], transform_input: bool = True) -> None:
        if self.state != "ENABLED":
            return
        if self.scheduled_expression and not self.event_pattern._pattern:
            return  # a schedule rule matches no event
        if not self.event_pattern.matches_event(cast(Any, original_event)):
            return
        others = _deliver(self, original_event, deliveries, transform_input)
        if others:
            rest = copy.copy(self)
            rest.targets = others
            original(rest, original_event, transform_input)

    patcher.replace(Rule, "send_to_targets", send_to_targets)

    original_replay: Callable[[EventsReplay, Archive], None] = patcher.original(EventsReplay, "replay_events")

    def replay_events(self: EventsReplay, archive: Archive) -> None:
        start, end = _epoch(self.event_start_time), _epoch(self.event_end_time)
        window = copy.copy(archive)  # the same archive, with only the window's events to go through
        window.events = [e for e in archive.events if start <= _epoch(e.get("time")) <= end]
        original_replay(self, window)

    patcher.replace(EventsReplay, "replay_events", replay_events)


def _epoch(value: Any) -> float:
    """A time as moto holds it (epoch seconds, as a number or text; ISO text) -> epoch seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value)
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _deliver(
    rule: Rule, message: dict[str, Any], deliveries: list[Delivery], transform_input: bool = True
) -> list[dict[str, Any]]:
    """Deliver to the rule's Lambda and Step Functions targets (a Lambda target's through the delivery
    hook, if one is installed); returns the other targets."""
    others = []
    event = aws_event(message)
    faults = _installed.delivery_faults if _installed is not None else None
    for target in rule.targets:
        arn = str(target["Arn"])
        service = arn.split(":")[2] if arn.count(":") >= 5 else ""
        if service not in ("lambda", "states"):
            others.append(target)
            continue

        def send(target: dict[str, Any] = target, arn: str = arn, service: str = service) -> str | None:
            error = None
            try:
                payload = _target_input(target, event) if transform_input else event
                if service == "lambda":
                    error = _deliver_to_lambda(arn, payload)
                else:
                    _deliver_to_state_machine(arn, payload)
            except Exception as e:  # EventBridge keeps going: one target's failure is not the others'
                error = f"{type(e).__name__}: {e}"
            if error is not None:
                logger.warning("EventBridge delivery failed", extra={"rule": rule.name, "target": arn, "error": error})
            deliveries.append(Delivery(rule=rule.name, target_arn=arn, event_id=str(event["id"]), error=error))
            return error

        if service == "lambda" and faults is not None:
            faults.deliver(rule.name, arn, event, send, _undeliverable(rule, target, event))
        else:
            send()
    return others


# EventBridge's RetryPolicy defaults ("Event retry policy and using dead-letter queues", EventBridge User Guide)
DEFAULT_MAXIMUM_EVENT_AGE_SECONDS = 86_400
DEFAULT_MAXIMUM_RETRY_ATTEMPTS = 185


def _undeliverable(rule: Rule, target: Mapping[str, Any], event: Mapping[str, Any]) -> Undeliverable:
    """What EventBridge does with `event` once every retry to `target` failed: to its DeadLetterConfig queue,
    with the attributes AWS sets (RULE_ARN, TARGET_ARN, ERROR_CODE, ERROR_MESSAGE, EXHAUSTED_RETRY_CONDITION,
    RETRY_ATTEMPTS: "Using dead-letter queues to process undelivered events", EventBridge User Guide), the
    event as the body."""
    policy = target.get("RetryPolicy") or {}
    retries = int(policy.get("MaximumRetryAttempts", DEFAULT_MAXIMUM_RETRY_ATTEMPTS))
    max_age = float(policy.get("MaximumEventAgeInSeconds", DEFAULT_MAXIMUM_EVENT_AGE_SECONDS))
    queue_arn = (target.get("DeadLetterConfig") or {}).get("Arn")

    def give_up(error_code: str, error_message: str) -> None:
        if not queue_arn:
            return
        from moto.sqs.models import sqs_backends

        _, _, _, region, account, queue_name = str(queue_arn).split(":", 5)
        attributes = {
            "RULE_ARN": rule.arn,
            "TARGET_ARN": str(target["Arn"]),
            "ERROR_CODE": error_code,
            "ERROR_MESSAGE": error_message[:256],
            "EXHAUSTED_RETRY_CONDITION": "MaximumEventAgeInSeconds",  # given up on after_seconds, the age
            "RETRY_ATTEMPTS": str(retries),
        }
        sqs_backends[account][region].send_message(
            queue_name,
            json.dumps(dict(event)),
            message_attributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
        )

    return Undeliverable(give_up=give_up, after_seconds=max_age)


def fire_scheduled_rule(name: str, *, account_id: str, region: str, when: datetime, event_bus: str = "default") -> str:
    """What EventBridge does when a schedule rule fires: a `Scheduled Event` to each of its targets
    (moto runs no schedule). Lambda and Step Functions targets only; returns the event id."""
    from moto.events.models import events_backends
    from moto.moto_api._internal import mock_random

    current = _installed
    if current is None:
        raise RuntimeError("spotrelay.local patches are not installed")
    rule = events_backends[account_id][region].describe_rule(name, event_bus)
    message = {
        "version": "0",
        "id": str(mock_random.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account_id,
        "time": when.timestamp(),
        "region": region,
        "resources": [rule.arn],
        "detail": {},
    }
    _deliver(rule, message, current.deliveries)
    return str(message["id"])


def _deliver_to_lambda(arn: str, payload: Any) -> str | None:
    """An asynchronous invocation, as EventBridge makes it; returns the function error, if any."""
    from moto.awslambda.utils import get_backend

    parts = arn.split(":")
    region, account = parts[3], parts[4]
    function = get_backend(account, region).get_function(arn)
    response_headers: dict[str, Any] = {}
    result = function.invoke(json.dumps(payload), {"x-amz-invocation-type": "Event"}, response_headers)
    if "x-amz-function-error" in response_headers:
        text = result.decode() if isinstance(result, bytes) else str(result)
        return f"function error: {text[:500]}"
    return None


def _deliver_to_state_machine(arn: str, payload: Any) -> None:
    from moto.moto_api._internal import mock_random

    parts = arn.split(":")
    region, account = parts[3], parts[4]
    backend = sfn_responses.get_backend(account, region)
    backend.start_execution(arn, name=str(mock_random.uuid4()), execution_input=json.dumps(payload))


# --- the virtual clock ---------------------------------------------------------------------------------


def _patch_clock(patcher: _Patcher, clock: SimulationClock) -> None:
    original_start: Callable[[ExecutionWorker], None] = patcher.original(ExecutionWorker, "start")

    def start(self: ExecutionWorker) -> None:
        name = self._evaluation_details.execution_details.arn
        process = clock.spawn(str(name))
        logic: Callable[[], None] = self._execution_logic

        def run_on_clock() -> None:
            clock.begin(process)
            try:
                logic()
            finally:
                clock.end(process)

        self._execution_logic = run_on_clock  # type: ignore[method-assign]
        try:
            original_start(self)
        except BaseException:
            clock.end(process)
            raise

    patcher.replace(ExecutionWorker, "start", start)

    def _is_clock_event(value: Any) -> bool:
        return not isinstance(value, threading.Event)

    def _wait_interval(self: WaitFunction, env: Any, wait_seconds: int) -> None:
        if wait_seconds <= 0:
            return
        deadline = clock.now() + timedelta(seconds=wait_seconds)
        interrupt = env.program_state_event if _is_clock_event(env.program_state_event) else None
        while env.is_running() and clock.now() < deadline:
            clock.sleep_until(deadline, interrupt=interrupt)

    patcher.replace(WaitFunction, "_wait_interval", _wait_interval)

    def _get_wait_seconds(self: Timestamp, env: Any) -> int:
        self.string.eval(env=env)
        timestamp_str: str = env.stack.pop()
        timestamp = self._from_timestamp_string(timestamp=timestamp_str)
        if timestamp is None:
            raise FailureEventException(self._create_failure_event(env, timestamp_str))
        return int((timestamp.replace(tzinfo=UTC) - clock.now()).total_seconds())

    patcher.replace(Timestamp, "_get_wait_seconds", _get_wait_seconds)

    patcher.replace(retrier_decl, "time", _ClockTime(time, clock))

    def make_event() -> Any:
        return clock.event()

    patcher.replace(callback, "Event", make_event)

    original_init: Callable[..., None] = patcher.original(sfn_environment.Environment, "__init__")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.program_state_event = clock.event()

    patcher.replace(sfn_environment.Environment, "__init__", __init__)


class _ClockTime:
    """Stands in for the `time` module in retrier_decl: `sleep` sleeps on the clock."""

    def __init__(self, real: ModuleType, clock: SimulationClock) -> None:
        self._real = real
        self._clock = clock

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


# --- CloudFormation ----------------------------------------------------------------------------------


class _ChangeSetNotFound(CloudFormationError):
    code = "ChangeSetNotFoundException"  # the model's shape: serialized as ChangeSetNotFound, HTTP 404


def _patch_cloudformation(patcher: _Patcher) -> None:
    cfn_models.register()

    def create_state_machine(
        cls: type[StateMachine],
        /,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        from moto.stepfunctions.utils import cfn_to_api_tags

        properties = cloudformation_json["Properties"]
        definition = properties.get("DefinitionString")
        if definition is None and "Definition" in properties:
            definition = json.dumps(properties["Definition"])
        return sfn_responses.get_backend(account_id, region_name).create_state_machine(
            name=properties.get("StateMachineName", resource_name),
            definition=definition or "",
            roleArn=properties.get("RoleArn", ""),
            tags=cfn_to_api_tags(properties.get("Tags", [])),
            loggingConfiguration=_lower_keys(properties.get("LoggingConfiguration")),
            tracingConfiguration=_lower_keys(properties.get("TracingConfiguration")),
            sm_type=properties.get("StateMachineType"),
        )

    def delete_state_machine(
        cls: type[StateMachine], /, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str
    ) -> None:
        sfn_responses.get_backend(account_id, region_name).delete_state_machine(resource_name)

    def update_state_machine(
        cls: type[StateMachine],
        /,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
    ) -> Any:
        properties = cloudformation_json.get("Properties", {})
        backend = sfn_responses.get_backend(account_id, region_name)
        name = properties.get("StateMachineName", original_resource.name)
        if name != original_resource.name:
            created = create_state_machine(cls, name, cloudformation_json, account_id, region_name)
            backend.delete_state_machine(original_resource.arn)
            return created
        return backend.update_state_machine(
            original_resource.arn, definition=properties.get("DefinitionString"), role_arn=properties.get("RoleArn")
        )

    patcher.replace(StateMachine, "create_from_cloudformation_json", classmethod(create_state_machine))
    patcher.replace(StateMachine, "delete_from_cloudformation_json", classmethod(delete_state_machine))
    patcher.replace(StateMachine, "update_from_cloudformation_json", classmethod(update_state_machine))

    # A stack made by executing a change set (`cdk deploy`) kept the outputs of the template it was created
    # with, an empty one: describe-stacks listed none, and every command said the stack was not spotrelay's.
    # As CloudFormation does, a change set's execution gives the stack its template's outputs
    original_apply: Callable[[ChangeSet], None] = patcher.original(ChangeSet, "apply")

    def apply(self: ChangeSet) -> None:
        original_apply(self)
        self.stack.template_dict = self.template_dict
        self.stack.output_map = self.stack._create_output_map()

    patcher.replace(ChangeSet, "apply", apply)

    # The CDK CLI deletes its previous change set by name before it makes one; moto raises UnboundLocalError
    # (an HTTP 500 the CLI cannot parse, and `cdk deploy` of an existing stack fails) when there is none.
    # No change set of that name: nothing to delete
    original_delete: Callable[[Any, str], None] = patcher.original(CloudFormationBackend, "delete_change_set")

    def delete_change_set(self: Any, change_set_name: str) -> None:
        known = change_set_name in self.change_sets or any(
            c.change_set_name == change_set_name for c in self.change_sets.values()
        )
        if known:
            original_delete(self, change_set_name)

    patcher.replace(CloudFormationBackend, "delete_change_set", delete_change_set)

    # ... and asks for it first: AWS answers ChangeSetNotFound (404), which the CLI takes for "none";
    # stock moto answers "Stack with id <change set name> does not exist", which stops the deploy
    original_describe: Callable[[Any, str], Any] = patcher.original(CloudFormationBackend, "describe_change_set")

    def describe_change_set(self: Any, change_set_name: str) -> Any:
        try:
            return original_describe(self, change_set_name)
        except CfnValidationError:
            raise _ChangeSetNotFound(f"ChangeSet [{change_set_name}] does not exist") from None

    patcher.replace(CloudFormationBackend, "describe_change_set", describe_change_set)

    # A parameter of type AWS::SSM::Parameter::Value<...> holds the parameter's name, which CloudFormation
    # resolves at each deployment. moto kept only the resolved value (an AMI id), so an update that keeps the
    # previous value (`cdk deploy` of an existing stack: UsePreviousValue) looked that id up as a name, and
    # failed. The previous value of such a parameter is its name, as given or the template's default
    def stack_parameters(self: CfnStack) -> dict[str, Any]:
        parameters = dict(self.resource_map.resolved_parameters)
        for key, slot in (self.template_dict.get("Parameters") or {}).items():
            if key in parameters and str(slot.get("Type", "")).startswith("AWS::SSM::Parameter::"):
                parameters[key] = (self.parameters or {}).get(key, slot.get("Default"))
        return parameters

    patcher.replace(CfnStack, "stack_parameters", property(stack_parameters))

    def key_properties(properties: dict[str, Any], resource_name: str) -> str:
        properties["Tags"] = [
            {"TagKey": t.get("Key", t.get("TagKey")), "TagValue": t.get("Value", t.get("TagValue"))}
            for t in properties.get("Tags", [])
        ]
        if isinstance(properties.get("KeyPolicy"), dict):
            properties["KeyPolicy"] = json.dumps(properties["KeyPolicy"])
        return resource_name

    def flow_log_properties(properties: dict[str, Any], resource_name: str) -> str:
        destination = properties.get("LogDestination")
        if properties.get("LogDestinationType") == "s3" and isinstance(destination, str):
            # moto looks the whole `bucket/prefix/` up as a bucket name: keep the bucket only.
            head, _, rest = destination.partition(":::")
            properties["LogDestination"] = f"{head}:::{rest.split('/', 1)[0]}" if rest else destination
        return resource_name

    def archive_properties(properties: dict[str, Any], resource_name: str) -> str:
        if isinstance(properties.get("EventPattern"), dict):
            properties["EventPattern"] = json.dumps(properties["EventPattern"])
        name = str(properties.get("ArchiveName") or resource_name)
        if len(name) > ARCHIVE_NAME_MAX:
            prefix, _, suffix = name.rpartition("-")
            name = f"{prefix[: ARCHIVE_NAME_MAX - len(suffix) - 1]}-{suffix}" if prefix else name[:ARCHIVE_NAME_MAX]
        return name

    _fix_cfn_properties(patcher, Key, key_properties)
    _fix_cfn_properties(patcher, FlowLogs, flow_log_properties)
    _fix_cfn_properties(patcher, Archive, archive_properties)


def _fix_cfn_properties(patcher: _Patcher, model: type[Any], fix: Callable[[dict[str, Any], str], str]) -> None:
    """Wrap `model.create_from_cloudformation_json` so that `fix` corrects a copy of the resource's
    Properties (and may rename the resource) before moto's own code sees them."""
    original: Callable[..., Any] = patcher.original(model, "create_from_cloudformation_json")

    def create(
        cls: type[Any],
        /,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        fixed = copy.deepcopy(cloudformation_json)
        name = fix(fixed.setdefault("Properties", {}), resource_name)
        return original(cls, name, fixed, account_id, region_name, **kwargs)

    patcher.replace(model, "create_from_cloudformation_json", classmethod(create))


def _lower_keys(value: Any) -> Any:
    """CloudFormation's PascalCase configuration -> the API's camelCase (LoggingConfiguration, ...)."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _lower_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_lower_keys(item) for item in value]
    return value


# --- S3 ------------------------------------------------------------------------------------------------


def _patch_s3(patcher: _Patcher) -> None:
    def get_permission(self: FakeBucket, action: str, resource: str) -> Any:
        from moto.iam.access_control import IAMPolicy, PermissionResult

        if self.policy is None:
            return PermissionResult.NEUTRAL
        document = json.loads(self.policy.decode())
        statements = document.get("Statement", [])
        if isinstance(statements, dict):
            statements = [statements]
        unconditioned = [s for s in statements if isinstance(s, dict) and not s.get("Condition")]
        if not unconditioned:
            return PermissionResult.NEUTRAL
        return IAMPolicy(json.dumps({**document, "Statement": unconditioned})).is_action_permitted(action, resource)

    patcher.replace(FakeBucket, "get_permission", get_permission)


# --- speed -------------------------------------------------------------------------------------------

# DynamoDB's AttributeValue members (botocore's dynamodb service model) and what each holds
_SCALAR_MEMBERS = frozenset({"S", "N"})
_FLAG_MEMBERS = frozenset({"NULL", "BOOL"})
_ATTRIBUTE_VALUE_MEMBERS = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})


class _NotPlain(Exception):
    """An attribute value the direct path does not convert (moto's generic path takes it)."""


def _attribute_value_json(serializer: BaseJSONSerializer, value: Any) -> dict[str, Any]:
    """{"S": "x"} / {"M": {...}} / ... as DynamoDB's JSON protocol has it, exactly as moto's generic
    serializer writes it (blobs base64, numbers as strings, None members left out)."""
    if type(value) is not dict or not value.keys() <= _ATTRIBUTE_VALUE_MEMBERS:
        raise _NotPlain
    out: dict[str, Any] = {}
    for member, inner in value.items():
        if inner is None:
            continue
        if member in _SCALAR_MEMBERS:
            if type(inner) is not str:
                raise _NotPlain
            out[member] = inner
        elif member in _FLAG_MEMBERS:
            if type(inner) is not bool:
                raise _NotPlain
            out[member] = inner
        elif member == "B":
            if not isinstance(inner, bytes | str):
                raise _NotPlain
            out[member] = serializer._base64(inner)
        elif member in ("SS", "NS"):
            if type(inner) is not list or not all(type(i) is str for i in inner):
                raise _NotPlain
            out[member] = list(inner)
        elif member == "BS":
            if type(inner) is not list or not all(isinstance(i, bytes | str) for i in inner):
                raise _NotPlain
            out[member] = [serializer._base64(i) for i in inner]
        elif member == "M":
            if type(inner) is not dict:
                raise _NotPlain
            out[member] = {str(k): _attribute_value_json(serializer, v) for k, v in inner.items() if v is not None}
        else:  # "L"
            if type(inner) is not list:
                raise _NotPlain
            out[member] = [_attribute_value_json(serializer, v) for v in inner]
    return out


_ASL_TREES: dict[str, Any] = {}  # state machine definition -> its parse tree, for every replay of the process


def _patch_speed(patcher: _Patcher) -> None:
    original_structure: Callable[..., None] = patcher.original(BaseJSONSerializer, "_serialize_type_structure")

    def serialize_type_structure(self: BaseJSONSerializer, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and shape.members.keys() == _ATTRIBUTE_VALUE_MEMBERS:
            try:
                serialized[self.get_serialized_name(shape, key)] = _attribute_value_json(self, value)
                return
            except _NotPlain:
                pass
        original_structure(self, serialized, value, shape, key)

    patcher.replace(BaseJSONSerializer, "_serialize_type_structure", serialize_type_structure)

    original_names: Callable[[object], list[str]] = patcher.original(moto_responses, "method_names_from_class")
    names: dict[object, list[str]] = {}

    def method_names_from_class(clazz: object) -> list[str]:
        known = names.get(clazz)
        if known is None:
            known = names[clazz] = original_names(clazz)
        return list(known)

    patcher.replace(moto_responses, "method_names_from_class", method_names_from_class)

    # moto makes an RSA-2048 private key (80 ms) for every KMS key it creates, a symmetric one too, for
    # Sign/Verify/GetPublicKey: a deploy creates five (the stack's keys, DynamoDB's and EBS's default
    # keys) and nothing here signs. Made at its first use instead
    make_private_key = patcher.original(moto_kms_models, "generate_private_key")
    patcher.replace(
        moto_kms_models, "generate_private_key", lambda key_spec: _LazyPrivateKey(make_private_key, key_spec)
    )

    # CloudFormation reads a template as YAML first, JSON only if that fails: JSON is YAML, so a synthesized
    # template (JSON, 300 KB) goes through PyYAML's pure-Python loader, most of every deploy. JSON first
    # for a document that is one: the same dict (tests/local/test_patches_speed.py compares them)
    original_template: Callable[[str], dict[str, Any]] = patcher.original(CfnStack, "parse_template")

    def parse_template(template: str) -> dict[str, Any]:
        if template.lstrip().startswith("{"):
            try:
                parsed = json.loads(template)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed
        return original_template(template)

    patcher.replace(CfnStack, "parse_template", staticmethod(parse_template))

    # Step Functions parses a state machine's definition (ANTLR, in pure Python) at every
    # execution's start; the parse tree depends only on the text, and each execution's program (the
    # evaluation components, which hold state) is still built afresh from it, as moto does
    original_parse: Callable[[str], tuple[Any, Any]] = patcher.original(asl_parser.AmazonStateLanguageParser, "parse")
    trees = _ASL_TREES

    def parse(definition: str) -> tuple[Any, Any]:
        tree = trees.get(definition)
        if tree is None:
            program, tree = original_parse(definition)  # raises on a definition with syntax errors
            trees[definition] = tree
            return program, tree
        return Preprocessor().visit(tree), tree

    patcher.replace(asl_parser.AmazonStateLanguageParser, "parse", staticmethod(parse))

    # moto's generic serializer asks six alias providers, at every member of every object it answers with
    # (a DescribeInstances of 4 instances: about 4,000 times), which keys to try. Their answer depends
    # only on the object's class and `Meta`, the key and the shape (and the shape's parent): remembered
    # per those, with the shape kept alive so that its id cannot be reused by another
    keys_known: dict[tuple[Any, ...], tuple[Any, tuple[str, ...]]] = {}
    # A response class's transformers (its RESPONSE_KEY_PATH_TO_TRANSFORMER), kept alive, with how many it had,
    # and per key path the transformer's path that applies (or None): moto tried each suffix at every member.
    # Some responses add a transformer to the class's dict at a request (EC2's VPC peering): a new count
    # starts afresh
    transforms_known: dict[int, tuple[Mapping[str, Any], int, dict[str, str | None]]] = {}

    def pick(self: AttributePicker, context: AttributePickerContext) -> Any:
        obj, shape = context.obj, context.shape
        cache_key: tuple[Any, ...] = (type(self), tuple(self.alias_providers), type(obj), getattr(obj, "Meta", None))
        cache_key += (context.key, id(shape), id(getattr(shape, "parent", None)))
        known = keys_known.get(cache_key)
        if known is None or known[0] is not shape:
            known = keys_known[cache_key] = (shape, tuple(self.get_possible_keys(context)))
        value = None
        for possible_key in known[1]:
            found = moto_get_value(obj, possible_key, MOTO_MISSING)
            if found is not MOTO_MISSING:
                value = found
                break
        transformers = self.response_transformers
        if transformers:  # as moto applies them: the first whose path ends the member's, found once per path
            known_paths = transforms_known.get(id(transformers))
            if known_paths is None or known_paths[0] is not transformers or known_paths[1] != len(transformers):
                known_paths = transforms_known[id(transformers)] = (transformers, len(transformers), {})
            key_path = f"{context.key_path}.{context.key}"  # shape names and keys: a bounded set
            if key_path in known_paths[2]:
                path = known_paths[2][key_path]
            else:
                path = known_paths[2][key_path] = next((p for p in transformers if key_path.endswith(p)), None)
            if path is not None:
                return transformers[path](value)  # looked up now: a response may set its own at each request
        return value

    patcher.replace(AttributePicker, "__call__", pick)

    # jsonpath_ng's `parse` builds its PLY parser (the grammar's tables) at every call: moto's event input
    # transformer and Step Functions' paths call it per event and per state. A parsed path is immutable
    # (find and update_or_create read it only): parsed once per text
    def cached(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        parsed: dict[str, Any] = {}

        def parse_once(path: str, debug: bool | None = None) -> Any:
            known = parsed.get(path)
            if known is None:
                known = parsed[path] = parse(path)
            return known

        return parse_once

    ext_parse = cached(patcher.original(jsonpath_ng.ext, "parse"))
    patcher.replace(jsonpath_ng.ext, "parse", ext_parse)  # moto.events.utils imports it at each call
    patcher.replace(sfn_json_path, "parse", ext_parse)
    patcher.replace(sfn_result_path, "parse", cached(patcher.original(sfn_result_path, "parse")))

    # botocore signs every request (SigV4: the canonical request, hashing the payload, five HMACs): moto
    # checks no signature (IAM authorization is off here), only the Authorization header's credential scope
    # (account and region), which botocore still writes. The signature is left as a fixed string
    patcher.replace(SigV4Auth, "canonical_request", lambda self, request: f"{request.method} {request.url}")
    patcher.replace(SigV4Auth, "signature", lambda self, string_to_sign, request: "0" * 64)

    _patch_clients(patcher)
    _patch_dynamodb_query(patcher)


class _LazyPrivateKey:
    """A KMS key's private key, generated when the key first signs, verifies or gives its public key."""

    def __init__(self, make: Callable[[str], Any], key_spec: str) -> None:
        self._make = make
        self._key_spec = key_spec
        self._key: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        with self._lock:
            if self._key is None:
                self._key = self._make(self._key_spec)
        return getattr(self._key, name)


_LOADERS: dict[str | None, Any] = {}  # search path -> botocore's data loader (read-only data: the service models)


class _SearchPaths(list[str]):
    """A shared loader's search paths: each boto3 Session appends its own data directory to its loader's
    list, which, shared, would grow by one entry per session."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


def _patch_default_amis(patcher: _Patcher) -> None:
    """moto loads its catalogue of public AMIs (10,000 objects, half a second) into every EC2 backend it
    makes; the stack's workers boot the AMI the deploy registers (spotrelay.local.deploy). Off, by the
    function behind moto's own MOTO_EC2_LOAD_DEFAULT_AMIS setting, while the patches are installed (not a
    speed patch: DescribeImages then answers without moto's public AMIs)."""
    patcher.replace(moto.settings, "ec2_load_default_amis", lambda: False)


def _patch_clients(patcher: _Patcher) -> None:
    """Clients made in less time: a replay makes hundreds (an instance's job-scoped clients, and one per
    Lambda task of every execution)."""
    # Every botocore Session makes its own data loader, so every session's first client reads and decodes the
    # service model's JSON again. The loader's files are read-only data: one loader per search path serves
    # every session
    original_loader: Callable[..., Any] = patcher.original(botocore_session, "create_loader")
    loaders = _LOADERS  # kept from one installation to the next: each runtime's clients would decode it all again

    def create_loader(search_path_string: str | None = None) -> Any:
        loader = loaders.get(search_path_string)
        if loader is None:
            loader = loaders[search_path_string] = original_loader(search_path_string)
            loader._search_paths = _SearchPaths(loader.search_paths)
        return loader

    patcher.replace(botocore_session, "create_loader", create_loader)

    # moto's Step Functions makes a new boto3 client for every Lambda task it runs, always with
    # the same fixed keys (it ignores the task's credentials): one per region and service, reused
    original_client: Callable[..., Any] = patcher.original(sfn_lambda_eval, "boto_client_for")
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with lock:
            client = clients.get((region, service))
            if client is None:
                client = clients[(region, service)] = original_client(region, service)
        return client

    patcher.replace(sfn_lambda_eval, "boto_client_for", boto_client_for)


_QUERY_SCOPE = threading.local()  # (table, its candidates) while this thread's Query runs


def _patch_dynamodb_query(patcher: _Patcher) -> None:
    """moto's Query takes its candidates from `Table.all_items()`: every item of the table, sorted, at each
    Query (a table of 4,000 items: 4,000 key comparisons and a sort, for the ten items of one partition).
    It sorts the candidates itself afterwards (by the table's or the index's keys), so their order does not
    matter, only which they are: a table Query gets its partition's items; an index Query the items whose
    index hash attributes are equal (DynamoType's own equality: type and cast value) to the condition's,
    without the sort. moto's own checks then run on those as on all. Other readers of all_items (Scan, a
    Query of another table or in another thread) get moto's answer."""
    original_all: Callable[[DynamoTable], list[Any]] = patcher.original(DynamoTable, "all_items")
    original_query: Callable[..., Any] = patcher.original(DynamoTable, "query")

    def all_items(self: DynamoTable) -> list[Any]:
        scope = getattr(_QUERY_SCOPE, "table", None)
        if scope is not None and scope[0] is self:
            return cast(list[Any], scope[1]())
        return original_all(self)

    def query(self: DynamoTable, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        conditions: list[tuple[str, DynamoType]] = list(kwargs.get("hash_key_conditions") or [])

        def partition() -> list[Any]:
            held = self.items.get(hash_key)
            if held is None:
                return []
            return list(held.values()) if self.range_key_attr else [held]

        def matching() -> list[Any]:
            found: list[Any] = []
            held: Any
            for held in self.items.values():
                for item in held.values() if self.range_key_attr else (held,):
                    for name, wanted in conditions:
                        value = item.attrs.get(name)
                        if value is None or value.type != wanted.type or value.cast_value != wanted.cast_value:
                            break
                    else:
                        found.append(item)
            return found

        if index_name:
            if not conditions:
                return original_query(self, hash_key, *args, **kwargs)
            candidates = matching
        else:
            if hash_key is None:
                return original_query(self, hash_key, *args, **kwargs)
            candidates = partition
        _QUERY_SCOPE.table = (self, candidates)
        try:
            return original_query(self, hash_key, *args, **kwargs)
        finally:
            _QUERY_SCOPE.table = None

    patcher.replace(DynamoTable, "all_items", all_items)
    patcher.replace(DynamoTable, "query", query)


# --- EC2 -----------------------------------------------------------------------------------------------


def _patch_ec2(patcher: _Patcher, market: Ec2Market) -> None:
    original_run: Callable[[Any], Any] = patcher.original(InstanceResponse, "run_instances")

    def run_instances(self: InstanceResponse) -> Any:
        return market.run_instances(self, original_run)

    patcher.replace(InstanceResponse, "run_instances", run_instances)
    original_terminate: Callable[[Any], Any] = patcher.original(InstanceResponse, "terminate_instances")

    def terminate_instances(self: InstanceResponse) -> Any:
        instance_ids = [str(i) for i in self._get_param("InstanceIds", [])]
        result = original_terminate(self)
        market.terminated(instance_ids)
        return result

    patcher.replace(InstanceResponse, "terminate_instances", terminate_instances)

    def describe_spot_price_history(self: SpotInstances) -> Any:
        return market.describe_spot_price_history(self)

    patcher.replace(SpotInstances, "describe_spot_price_history", describe_spot_price_history)

    types, offerings = _catalog_tables()
    added = [name for name in types if name not in moto_instance_types.INSTANCE_TYPES]
    patcher.replace_contents(moto_instance_types.INSTANCE_TYPES, types)
    patcher.replace_contents(moto_instance_types.INSTANCE_TYPE_OFFERINGS, offerings)
    backend = moto_instance_types.InstanceTypeBackend
    described = [*backend.instance_types, *(moto_instance_types.InstanceType(name) for name in added)]
    patcher.replace(backend, "instance_types", described)


_CATALOG_TABLES: tuple[dict[str, Any], dict[str, Any]] | None = None


def _catalog_tables() -> tuple[dict[str, Any], dict[str, Any]]:
    """moto's instance types and offerings with the catalog's missing GPU types added, built once per
    process from moto's own tables (`install` puts those back at uninstall). Only the containers the
    added rows go into are new; moto's rows are shared and never changed (a deep copy of all of its
    offerings took about a second of every replay)."""
    global _CATALOG_TABLES
    if _CATALOG_TABLES is None:
        original = moto_instance_types.INSTANCE_TYPE_OFFERINGS
        types: dict[str, Any] = dict(moto_instance_types.INSTANCE_TYPES)
        offerings: dict[str, Any] = {kind: dict(by_region) for kind, by_region in original.items()}
        for name in missing_instance_types(types):
            types[name] = instance_type_entry(name, types)
            for location_type, by_region in sibling_offerings(name, original).items():
                regions = offerings.setdefault(location_type, {})
                for region, rows in by_region.items():
                    regions[region] = [*regions.get(region, []), *rows]  # a new list: moto's stays as it was
        _CATALOG_TABLES = types, offerings
    return _CATALOG_TABLES


# --- DynamoDB faults -----------------------------------------------------------------------------------


class _Throttled(DynamodbException):
    error_type = DYNAMODB_ERROR_PREFIX + "ProvisionedThroughputExceededException"

    def __init__(self) -> None:
        super().__init__(
            self.error_type,
            "The level of configured provisioned throughput for the table was exceeded. Consider increasing "
            "your provisioning level with the UpdateTable API.",
        )


def versioned_attribute(request: Mapping[str, Any]) -> str | None:
    """The attribute a write is conditioned on being at the version its writer read (`version = :expected`,
    the store's optimistic concurrency), or None for any other write."""
    match = re.fullmatch(r"\s*(#?\w+)\s*=\s*:expected\s*", str(request.get("ConditionExpression") or ""))
    if match is None:
        return None
    names = request.get("ExpressionAttributeNames") or {}
    return str(names.get(match.group(1), match.group(1)))


def _bump_version(handler: DynamoHandler, attribute: str) -> bool:
    """The concurrent writer: the item the request names, its `attribute` one version on (nothing else
    changed). False if there is no such item or number."""
    body = handler.body
    table = handler.dynamodb_backend.get_table(body["TableName"])
    key = body.get("Key") or body.get("Item") or {}
    hash_value = key.get(table.hash_key_attr)
    range_value = key.get(table.range_key_attr) if table.range_key_attr else None
    if hash_value is None:
        return False
    item = table.get_item(DynamoType(hash_value), DynamoType(range_value) if range_value is not None else None)
    current = item.attrs.get(attribute) if item is not None else None
    if item is None or current is None or current.type != "N":
        return False
    item.attrs[attribute] = DynamoType({"N": str(int(current.value) + 1)})
    return True


def _patch_dynamodb_faults(patcher: _Patcher) -> None:
    for operation, name in (("PutItem", "put_item"), ("UpdateItem", "update_item")):
        original: Callable[[DynamoHandler], Any] = patcher.original(DynamoHandler, name)

        def write(self: DynamoHandler, original: Callable[[DynamoHandler], Any] = original, op: str = operation) -> Any:
            faults = _installed.store_faults if _installed is not None else None
            fault = faults.store_fault(op, self.body) if faults is not None else None
            if fault == STORE_THROTTLED:
                raise _Throttled()
            if fault == STORE_CONFLICT:
                attribute = versioned_attribute(self.body)
                if attribute is not None:
                    _bump_version(self, attribute)
            return original(self)

        patcher.replace(DynamoHandler, name, write)


# --- SQS on the virtual clock ------------------------------------------------------------------------


def _patch_sqs_clock(patcher: _Patcher, clock: SimulationClock) -> None:
    """SQS's message visibility, delays and receive timestamps read the virtual clock. moto reads them from
    the wall clock: a message the dispatcher left on the queue (a throttled write, a crash) came back after
    its visibility timeout of wall time, that is never within a replay of hours in seconds, and the job was
    lost to the replay (chaos seed 32 of happy-path). Long polls and retention keep moto's real time
    (`unix_time`): a poll must end however the virtual clock stands."""
    original: Callable[..., float] = patcher.original(moto_sqs_models, "unix_time_millis")

    def unix_time_millis(dt: datetime | None = None) -> float:
        if dt is not None:
            return original(dt)
        return clock.now().timestamp() * 1000.0

    patcher.replace(moto_sqs_models, "unix_time_millis", unix_time_millis)

    # ... and so a message's retention, which counts from its (now virtual) sent time
    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        retention = self.get_queue_attributes(queue_name, ["MessageRetentionPeriod"])["MessageRetentionPeriod"]
        return bool(float(retention) + message.sent_timestamp / 1000 > clock.now().timestamp())

    patcher.replace(
        moto_sqs_models.SQSBackend,
        "is_message_valid_based_on_retention_period",
        is_message_valid_based_on_retention_period,
    )
