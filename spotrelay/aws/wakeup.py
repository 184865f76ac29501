"""`Wakeup` by an asynchronous Lambda invocation of the dispatcher (best effort)."""

from __future__ import annotations

import json
import logging
from typing import Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError

logger = logging.getLogger(__name__)

WAKEUP_SOURCE = "spotrelay.wakeup"


class LambdaInvoker(Protocol):
    """The part of the boto3 Lambda client used here (boto3-stubs' LambdaClient satisfies it)."""

    def invoke(self, *, FunctionName: str, InvocationType: Literal["Event"], Payload: bytes) -> object: ...


class LambdaWakeup:
    def __init__(self, client: LambdaInvoker, function_name: str) -> None:
        self.client = client
        self.function_name = function_name

    def wake_dispatcher(self, reason: str) -> None:
        payload = json.dumps({"source": WAKEUP_SOURCE, "reason": reason}).encode("utf-8")
        try:
            self.client.invoke(FunctionName=self.function_name, InvocationType="Event", Payload=payload)
        except (ClientError, BotoCoreError) as e:
            # The schedule runs the dispatcher anyway; a missed wake-up only delays admission.
            logger.warning(
                "could not wake the dispatcher",
                extra={"function_name": self.function_name, "reason": reason, "error": str(e)},
            )
