"""The customer-managed KMS keys of what a stack deletion deletes (queues, the alarm topic).

CloudFormation keeps a KMS key by default when its stack is deleted (CDK's default removal policy for
`kms.Key` is RETAIN), and a kept key is billed every month. A key here encrypts only resources deleted
with the stack, so it is scheduled for deletion with them, after the shortest pending window KMS allows
(7 days: "Deleting AWS KMS keys", AWS KMS Developer Guide); a key an update replaces is kept. The
checkpoint bucket's key is not one of them: the bucket outlives the stack, and its objects need their key.
"""

from __future__ import annotations

from aws_cdk import CfnDeletionPolicy, CfnResource, Duration, RemovalPolicy
from aws_cdk import aws_kms as kms
from constructs import Construct

KEY_PENDING_WINDOW = Duration.days(7)


def stack_key(scope: Construct, id: str, *, description: str) -> kms.Key:
    """A rotated key, deleted (after KEY_PENDING_WINDOW) with the stack."""
    key = kms.Key(
        scope,
        id,
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=KEY_PENDING_WINDOW,
    )
    # But a key replaced by an update (a construct moved, a logical id renamed) is kept: messages encrypted
    # with it may wait in a DLQ for 14 days, past the 7-day window
    resource = key.node.default_child
    assert isinstance(resource, CfnResource)
    resource.cfn_options.update_replace_policy = CfnDeletionPolicy.RETAIN
    return key
