"""boto3 adapters: each implements one port of `spotrelay.control.ports`. Clients and names come in
through the constructors (the Lambda entry points build them from their settings).

Import the adapter modules directly (`from spotrelay.aws.store import DynamoJobStore`): this package
re-exports nothing, so a function pays at cold start only for the adapters it uses.
"""
