"""Every change spotrelay's local runtime makes to moto (pinned: 5.2.5), in one package, with canaries.

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
of moto's body, that line) with what the patches were written against; `install` refuses to run on
any difference, naming it.

The modules (each lists its canaries, `Expected` entries, next to its patches; `EXPECTED` below assembles them
in the order they were written; every name stays importable from this package):
- `canaries`: `Expected`, `moto_differences`, `check_moto`, `MotoChanged` (the canary machinery);
- `installation`: `_Patcher`, `install`, `installed`, `Installed`, `Delivery`, `stop_stray_executions` (and
  the one installed state, `installation._installed`, that every module reads);
- `lambda_tasks`: Lambda in-process, SendTaskFailure's cause, closed task tokens;
- `events`: EventBridge delivery (`_deliver`, `DeliveryFaults`, `Undeliverable`, `fire_scheduled_rule`,
  `aws_event`) and replays;
- `virtual_clock`: Step Functions on the virtual clock; `sqs_clock`: SQS on it;
- `cloudformation`, `s3`, `ec2`: what the template and the market need of moto;
- `speed`: the serializer, the caches, unsigned requests, DynamoDB Query;
- `dynamodb_faults`: a chaos seed's DynamoDB faults (`StoreFaults`).
"""

from __future__ import annotations

from spotrelay.local.patches import (
    cloudformation,
    dynamodb_faults,
    ec2,
    events,
    installation,
    lambda_tasks,
    s3,
    speed,
    sqs_clock,
    virtual_clock,
)
from spotrelay.local.patches.canaries import (
    _ORIGINALS,
    MOTO_VERSION,
    Expected,
    MotoChanged,
    _unwrapped,
    check_moto,
    moto_differences,
)
from spotrelay.local.patches.cloudformation import (
    ARCHIVE_NAME_MAX,
    _ChangeSetNotFound,
    _fix_cfn_properties,
    _lower_keys,
    _patch_cloudformation,
)
from spotrelay.local.patches.dynamodb_faults import (
    STORE_CONFLICT,
    STORE_THROTTLED,
    StoreFaults,
    _bump_version,
    _patch_dynamodb_faults,
    _Throttled,
    versioned_attribute,
)
from spotrelay.local.patches.ec2 import _catalog_tables, _patch_default_amis, _patch_ec2
from spotrelay.local.patches.events import (
    DEFAULT_MAXIMUM_EVENT_AGE_SECONDS,
    DEFAULT_MAXIMUM_RETRY_ATTEMPTS,
    DeliveryFaults,
    Undeliverable,
    _deliver,
    _deliver_to_lambda,
    _deliver_to_state_machine,
    _epoch,
    _event_time,
    _patch_events,
    _target_input,
    _undeliverable,
    aws_event,
    fire_scheduled_rule,
)
from spotrelay.local.patches.installation import (
    Delivery,
    Installed,
    _install_lock,
    _Patcher,
    install,
    installed,
    stop_stray_executions,
)
from spotrelay.local.patches.lambda_tasks import _patch_lambda, _patch_task_failure
from spotrelay.local.patches.s3 import _patch_s3
from spotrelay.local.patches.speed import (
    _ASL_TREES,
    _ATTRIBUTE_VALUE_MEMBERS,
    _FLAG_MEMBERS,
    _LOADERS,
    _QUERY_SCOPE,
    _SCALAR_MEMBERS,
    _attribute_value_json,
    _LazyPrivateKey,
    _NotPlain,
    _patch_clients,
    _patch_dynamodb_query,
    _patch_speed,
    _SearchPaths,
)
from spotrelay.local.patches.sqs_clock import _patch_sqs_clock
from spotrelay.local.patches.virtual_clock import _SFN_ENV, _ClockTime, _patch_clock

# Every patch's canaries, in the order they were written (a module's entries are in groups where another's
# came between them). The installed state is not re-exported (a copy here would not follow `install`): it
# is `installation._installed`; nor is ec2's `_CATALOG_TABLES`, for the same reason.
EXPECTED: tuple[Expected, ...] = (
    *lambda_tasks.EXPECTED,
    *events.EXPECTED,
    *virtual_clock.EXPECTED_EXECUTIONS,
    *installation.EXPECTED,
    *virtual_clock.EXPECTED_WAITS,
    *cloudformation.EXPECTED_RESOURCES,
    *s3.EXPECTED,
    *speed.EXPECTED_SERIALIZER,
    *ec2.EXPECTED_DEFAULT_AMIS,
    *speed.EXPECTED_CACHES,
    *cloudformation.EXPECTED_CHANGE_SETS,
    *speed.EXPECTED_PARSERS,
    *dynamodb_faults.EXPECTED,
    *ec2.EXPECTED_MARKET,
    *sqs_clock.EXPECTED,
    *ec2.EXPECTED_INSTANCE_TYPES,
)

__all__ = [
    "ARCHIVE_NAME_MAX",
    "DEFAULT_MAXIMUM_EVENT_AGE_SECONDS",
    "DEFAULT_MAXIMUM_RETRY_ATTEMPTS",
    "EXPECTED",
    "MOTO_VERSION",
    "STORE_CONFLICT",
    "STORE_THROTTLED",
    "_ASL_TREES",
    "_ATTRIBUTE_VALUE_MEMBERS",
    "_FLAG_MEMBERS",
    "_LOADERS",
    "_ORIGINALS",
    "_QUERY_SCOPE",
    "_SCALAR_MEMBERS",
    "_SFN_ENV",
    "Delivery",
    "DeliveryFaults",
    "Expected",
    "Installed",
    "MotoChanged",
    "StoreFaults",
    "Undeliverable",
    "_ChangeSetNotFound",
    "_ClockTime",
    "_LazyPrivateKey",
    "_NotPlain",
    "_Patcher",
    "_SearchPaths",
    "_Throttled",
    "_attribute_value_json",
    "_bump_version",
    "_catalog_tables",
    "_deliver",
    "_deliver_to_lambda",
    "_deliver_to_state_machine",
    "_epoch",
    "_event_time",
    "_fix_cfn_properties",
    "_install_lock",
    "_lower_keys",
    "_patch_clients",
    "_patch_clock",
    "_patch_cloudformation",
    "_patch_default_amis",
    "_patch_dynamodb_faults",
    "_patch_dynamodb_query",
    "_patch_ec2",
    "_patch_events",
    "_patch_lambda",
    "_patch_s3",
    "_patch_speed",
    "_patch_sqs_clock",
    "_patch_task_failure",
    "_target_input",
    "_undeliverable",
    "_unwrapped",
    "aws_event",
    "check_moto",
    "cloudformation",
    "dynamodb_faults",
    "ec2",
    "events",
    "fire_scheduled_rule",
    "install",
    "installation",
    "installed",
    "lambda_tasks",
    "moto_differences",
    "s3",
    "speed",
    "sqs_clock",
    "stop_stray_executions",
    "versioned_attribute",
    "virtual_clock",
]
