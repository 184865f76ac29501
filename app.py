#!/usr/bin/env python3
"""CDK app entry: typed config from CDK context -> SchedulerStack (+ cdk-nag AwsSolutions checks).

Run through the CDK CLI (`make synth`, `npx cdk deploy -c max_concurrent_jobs=4 ...`); the context keys
and their formats are documented in `stacks/config.py`.
"""

from __future__ import annotations

import sys

from aws_cdk import App

from stacks.config import ConfigError, SpotRelayConfig
from stacks.scheduler_stack import build_scheduler


def main() -> None:
    app = App()
    try:
        config = SpotRelayConfig.from_context(app.node.try_get_context)
    except ConfigError as error:
        sys.exit(f"spotrelay: {error}")
    build_scheduler(app, config)
    app.synth()


if __name__ == "__main__":
    main()
