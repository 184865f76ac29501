"""The code asset: exactly the modules the handlers import, and enough to import every handler alone.

`runtime_imports` (stacks.functions_construct) decides what the asset holds; it is checked here on a
small tree whose answer is known, then the synthesized asset is checked against it, and each handler
is imported in a fresh interpreter that sees the asset and the installed packages but not the
repository (so a module the asset lacks cannot be found elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk.assertions import Template

from infrastructure import REPO_ROOT
from infrastructure.synth import Synthesized, render
from stacks.functions_construct import FUNCTION_NAMES, asset_excludes, asset_files, runtime_imports

# spotrelay's own dependencies that neither the Lambda runtime (boto3) nor the Powertools layer
# (Powertools, pydantic) provides: the CLI's and the job file loader's.
NOT_ON_LAMBDA = ("yaml", "typer", "rich")

# Run in the probe interpreter: refuse what Lambda lacks, import the handler module, and report where
# every module of ours came from.
PROBE = """
import importlib, json, sys

class NotOnLambda:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {not_on_lambda!r}:
            raise ModuleNotFoundError(f"{{name}} is neither in the Lambda runtime nor in the Powertools layer")
        return None

sys.meta_path.insert(0, NotOnLambda())
importlib.import_module(sys.argv[1])
ours = ("functions", "spotrelay")
print(json.dumps({{name: m.__file__ for name, m in sys.modules.items() if name.partition(".")[0] in ours}}))
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_runtime_imports_follow_what_runs_at_import_and_in_functions(tmp_path: Path) -> None:
    # Given a handler that imports eagerly, lazily, from a package, relatively and for type checking only
    _write(
        tmp_path,
        {
            "functions/__init__.py": "",
            "functions/handler.py": (
                "from typing import TYPE_CHECKING\n"
                "import pkg.eager\n"
                "from pkg import sub\n"
                "if TYPE_CHECKING:\n"
                "    import pkg.typing_only\n"
                "else:\n"
                "    import pkg.otherwise\n"
                "def handler():\n"
                "    from pkg.lazy import LAZY\n"
            ),
            "pkg/__init__.py": "from pkg.init_import import NAME\n",
            "pkg/init_import.py": "NAME = 1\n",
            "pkg/eager.py": "from pkg.deep.leaf import VALUE\nfrom . import relative\n",
            "pkg/deep/__init__.py": "",
            "pkg/deep/leaf.py": "VALUE = 1\n",
            "pkg/relative.py": "",
            "pkg/sub.py": "",
            "pkg/otherwise.py": "",
            "pkg/lazy.py": "LAZY = 1\n",
            "pkg/typing_only.py": "",
            "pkg/unused.py": "",
        },
    )
    # When its runtime imports are collected
    modules = runtime_imports(tmp_path, ["functions.handler"])
    # Then they are what running it can load: no type-checking-only or unused module, no stdlib
    assert modules == {
        "functions",
        "functions.handler",
        "pkg",
        "pkg.init_import",
        "pkg.eager",
        "pkg.deep",
        "pkg.deep.leaf",
        "pkg.relative",
        "pkg.sub",
        "pkg.otherwise",
        "pkg.lazy",
    }


def _staged_files(root: Path, outdir: Path, excludes: list[str]) -> set[str]:
    app = App(outdir=str(outdir), builtin_cloud_formation_validation=False)
    stack = Stack(app, "AssetOnly")
    lambda_.Function(
        stack,
        "Function",
        runtime=lambda_.Runtime.PYTHON_3_11,
        handler="functions/place.handler",
        code=lambda_.Code.from_asset(str(root), exclude=excludes),
    )
    [function] = Template.from_stack(stack).find_resources("AWS::Lambda::Function").values()
    return _files(outdir / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}")


def _files(directory: Path) -> set[str]:
    return {path.relative_to(directory).as_posix() for path in directory.rglob("*") if path.is_file()}


def test_the_excludes_keep_the_listed_files_only(tmp_path: Path) -> None:
    # Given a checkout with everything a developer's tree has next to the files to keep
    kept = ["functions/__init__.py", "functions/place.py", "spotrelay/__init__.py", "spotrelay/models/job_spec.py"]
    junk = [
        "app.py",
        ".gitignore",
        ".git/HEAD",
        ".venv/lib/python3.11/site-packages/spotrelay/models/job_spec.py",
        "cdk.out/manifest.json",
        "tests/unit/test_state.py",
        "functions/__pycache__/place.cpython-311.pyc",
        "spotrelay/config.py",
        "spotrelay/stray.pyc",
        "spotrelay/models/.DS_Store",
        "spotrelay/models/records.py",
        "spotrelay/local/runtime.py",
    ]
    _write(tmp_path / "checkout", dict.fromkeys(kept + junk, "x"))
    # When the asset is staged with the excludes for the kept files
    staged = _staged_files(tmp_path / "checkout", tmp_path / "cdk.out", asset_excludes(kept))
    # Then it holds those files and nothing else
    assert staged == set(kept)


def _asset_dir(synthesized: Synthesized) -> Path:
    code = synthesized.properties(synthesized.stack.functions.functions["dispatcher"])["Code"]
    return synthesized.outdir / f"asset.{code['S3Key'].removesuffix('.zip')}"


def test_the_asset_holds_exactly_the_modules_the_handlers_import(synthesized: Synthesized) -> None:
    # Given the staged asset (what CDK zips and uploads) and the handlers' runtime imports
    staged = _files(_asset_dir(synthesized))
    expected = set(asset_files(REPO_ROOT))
    # Then the asset holds every module a handler can load, and no other file
    assert sorted(expected - staged) == [], "the asset lacks modules the handlers import"
    assert sorted(staged - expected) == [], "the asset holds files no handler imports"
    assert {f"functions/{name}.py" for name in FUNCTION_NAMES} <= staged
    # And none of the local runtime, the benchmark or the CLI, which no function needs
    assert not [path for path in staged if path.startswith(("spotrelay/local/", "spotrelay/bench/", "spotrelay/cli/"))]


@pytest.fixture(scope="module")
def asset_copy(synthesized: Synthesized, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The asset copied outside the repository (the staged one sits in the test's cdk.out)."""
    copy = tmp_path_factory.mktemp("lambda") / "task"
    shutil.copytree(_asset_dir(synthesized), copy)
    return copy


@pytest.mark.parametrize("name", FUNCTION_NAMES)
def test_each_handler_imports_from_the_asset_alone(
    name: str, synthesized: Synthesized, asset_copy: Path, tmp_path: Path
) -> None:
    # Given the function's environment as the stack sets it (tokens rendered as placeholder text), and a
    # path of the asset and the installed packages only. `-S` skips site-packages' .pth files: the
    # editable install of spotrelay is one, and its finder looks in the repository. `-P` keeps the
    # current directory off the path.
    properties = synthesized.properties(synthesized.stack.functions.functions[name])
    variables = {key: str(value) for key, value in render(properties["Environment"]["Variables"]).items()}
    installed = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    environment = variables | {
        "PYTHONPATH": os.pathsep.join([str(asset_copy), *installed]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if "PYTHONPYCACHEPREFIX" in os.environ:  # compiled dependencies (make sets it), read only
        environment["PYTHONPYCACHEPREFIX"] = os.environ["PYTHONPYCACHEPREFIX"]
    # When a fresh interpreter, started outside the repository, imports the handler's module
    result = subprocess.run(
        [sys.executable, "-S", "-P", "-c", PROBE.format(not_on_lambda=NOT_ON_LAMBDA), f"functions.{name}"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    # Then it imports, and every module of ours it loaded came from the asset
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert f"functions.{name}" in loaded
    assert {module: file for module, file in loaded.items() if not Path(file).is_relative_to(asset_copy)} == {}
