"""Infrastructure tests: CDK assertions on the synthesized SchedulerStack.

`stacks/` is not an installed package (only `spotrelay` is), so the repository root goes on the path
here, before any test module imports it. jsii's warning that node 20 is past its end of life is
known (see the Makefile's synth target) and silenced before aws_cdk starts its node process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
