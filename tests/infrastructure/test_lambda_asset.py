"""The code asset's excludes, on a checkout-like tree made for the test (with and without functions/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template

from stacks.functions_construct import ASSET_EXCLUDES

CHECKOUT = (
    "app.py",
    "cdk.json",
    "README.md",
    ".gitignore",
    ".git/HEAD",
    ".venv/lib/python3.11/site-packages/boto3/__init__.py",
    "node_modules/aws-cdk/package.json",
    "cdk.out/manifest.json",
    "stacks/scheduler_stack.py",
    "tests/unit/test_state.py",
    "events/jobs/resnet50.yaml",
    "spotrelay.egg-info/PKG-INFO",
    "spotrelay/__init__.py",
    "spotrelay/config.py",
    "spotrelay/models/job_spec.py",
    "spotrelay/models/__pycache__/job_spec.cpython-311.pyc",
    "spotrelay/models/.DS_Store",
    "spotrelay/stray.pyc",
)


def _staged_files(root: Path, outdir: Path) -> set[str]:
    app = App(outdir=str(outdir), builtin_cloud_formation_validation=False)
    stack = Stack(app, "AssetOnly")
    lambda_.Function(
        stack,
        "Function",
        runtime=lambda_.Runtime.PYTHON_3_11,
        handler="functions/place.handler",
        code=lambda_.Code.from_asset(str(root), exclude=list(ASSET_EXCLUDES)),
    )
    [function] = Template.from_stack(stack).find_resources("AWS::Lambda::Function").values()
    key = function["Properties"]["Code"]["S3Key"]
    asset = outdir / f"asset.{key.removesuffix('.zip')}"
    return {str(path.relative_to(asset)) for path in asset.rglob("*") if path.is_file()}


@pytest.mark.parametrize("with_functions", [False, True])
def test_only_spotrelay_and_functions_sources_are_packaged(tmp_path: Path, with_functions: bool) -> None:
    # Given a checkout with everything a developer's tree has (functions/ not written yet, or written)
    root = tmp_path / "checkout"
    handlers = ("functions/__init__.py", "functions/place.py", "functions/__pycache__/place.cpython-311.pyc")
    for relative in CHECKOUT + (handlers if with_functions else ()):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    # When the asset is staged, Then only the package's and the handlers' sources are in it
    expected = {"spotrelay/__init__.py", "spotrelay/config.py", "spotrelay/models/job_spec.py"}
    if with_functions:
        expected |= {"functions/__init__.py", "functions/place.py"}
    assert _staged_files(root, tmp_path / "cdk.out") == expected
