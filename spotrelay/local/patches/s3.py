"""S3: a bucket policy's statements with a `Condition` are left out of moto's evaluation (the template's
TLS-only Deny statements would deny every request; see the package's docstring). Sibling of the other
subsystems' modules in spotrelay.local.patches; `installation` runs the patches.
"""

from __future__ import annotations

import json
from typing import Any

from moto.s3.models import FakeBucket

from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

EXPECTED: tuple[Expected, ...] = (
    Expected(
        FakeBucket,
        "get_permission",
        "(self, action: 'str', resource: 'str') -> 'Any'",
        ("iam_policy = IAMPolicy(self.policy.decode())",),
    ),
)


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
