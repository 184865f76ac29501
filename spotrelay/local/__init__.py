"""The local runtime: the whole system on moto in one process, events on a virtual clock.

- `VirtualClock` / `WallClock` (spotrelay.local.clock): simulated time; the replay drives the first.
- `LocalRuntime` (spotrelay.local.runtime): moto's mock, the patches, the clock and the market.
- `deploy_template` / `LocalStack` (spotrelay.local.deploy): the synthesized template into moto.
- `Ec2Market` (spotrelay.local.ec2_market): a SpotMarket behind moto's EC2 API.
- `spotrelay.local.patches`: every change made to moto, with canaries (moto is pinned).
"""

from spotrelay.local.clock import ClockStalled, VirtualClock, WallClock
from spotrelay.local.deploy import DeployError, LocalStack, deploy_template, synthesize, template_path
from spotrelay.local.ec2_market import Ec2Market, Launch, Refusal
from spotrelay.local.runtime import LocalRuntime

__all__ = [
    "ClockStalled",
    "DeployError",
    "Ec2Market",
    "Launch",
    "LocalRuntime",
    "LocalStack",
    "Refusal",
    "VirtualClock",
    "WallClock",
    "deploy_template",
    "synthesize",
    "template_path",
]
