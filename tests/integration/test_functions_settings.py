"""Every function validates its settings at cold start: its module imports with exactly its settings
model's environment, and fails to import, naming the variable, when one is missing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from spotrelay.config import SETTINGS_BY_FUNCTION

from .aws_resources import Lifecycle, Network, Queues
from .function_harness import FUNCTIONS, function_environment, import_fresh, set_function_environment

# Names only: nothing is called at import, so the resources need not exist.
ENVIRONMENT = function_environment(
    Queues(
        queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/spotrelay-jobs",
        dlq_url="https://sqs.us-east-1.amazonaws.com/123456789012/spotrelay-jobs-dlq",
    ),
    Lifecycle(
        state_machine_arn="arn:aws:states:us-east-1:123456789012:stateMachine:JobLifecycle",
        token_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/spotrelay-task-tokens",
    ),
    Network(launch_template_id="lt-0123456789abcdef0", subnets={"us-east-1a": "subnet-0a", "us-east-1b": "subnet-0b"}),
)
SETTING_CASES = [
    pytest.param(name, key, id=f"{name}-without-{key}")
    for name in FUNCTIONS
    for key in sorted(SETTINGS_BY_FUNCTION[name].env_keys())
]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_function_imports_with_exactly_its_settings(aws: None, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # Given only the environment the stack gives this function
    set_function_environment(monkeypatch, name, ENVIRONMENT)

    # When its module is imported (a cold start)
    module = import_fresh(name, monkeypatch)

    # Then its settings are the environment's values, validated by its own model
    settings_model = SETTINGS_BY_FUNCTION[name]
    assert type(module.settings) is settings_model
    assert module.settings == settings_model.from_env({key: ENVIRONMENT[key] for key in settings_model.env_keys()})


@pytest.mark.parametrize(("name", "missing"), SETTING_CASES)
def test_a_missing_setting_fails_the_cold_start_naming_it(
    aws: None, monkeypatch: pytest.MonkeyPatch, name: str, missing: str
) -> None:
    # Given the function's environment without one of its variables
    set_function_environment(monkeypatch, name, ENVIRONMENT, without=missing)

    # When its module is imported / Then the import fails with a validation error naming the variable
    with pytest.raises(ValidationError) as error:
        import_fresh(name, monkeypatch)
    assert [e["loc"] for e in error.value.errors()] == [(missing,)]
    assert missing in str(error.value)
