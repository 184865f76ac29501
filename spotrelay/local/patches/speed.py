"""Speed: the same answers, less work (see the package's docstring, "Speed"): DynamoDB attribute values
serialized directly, caches (response method names, the serializer's attribute keys, jsonpath and ASL parses,
botocore's data loaders, Lambda tasks' clients), KMS private keys made at first use, a JSON template read as
JSON, requests left unsigned, and a DynamoDB Query that reads its partition only. `_patch_speed` installs all
of them. Siblings: `ec2` (moto's default AMIs left out), `installation` (runs the patches).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import jsonpath_ng
import jsonpath_ng.ext
from botocore import session as botocore_session
from botocore.auth import SigV4Auth
from moto.cloudformation.models import Stack as CfnStack
from moto.core import responses as moto_responses
from moto.core import serialize as moto_serialize
from moto.core.constants import MISSING as MOTO_MISSING
from moto.core.serialize import AttributePicker, AttributePickerContext, BaseJSONSerializer
from moto.core.utils import get_value as moto_get_value
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table as DynamoTable
from moto.kms import models as moto_kms_models
from moto.kms.models import Key
from moto.stepfunctions.parser.asl.component.common.path import result_path as sfn_result_path
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils as sfn_lambda_eval
from moto.stepfunctions.parser.asl.parse import asl_parser
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.asl.utils import json_path as sfn_json_path

from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

# (EXPECTED, which the package assembles, lists the canaries of every module in the order they were written:
# this module's are in three groups only to keep that order)

EXPECTED_SERIALIZER: tuple[Expected, ...] = (
    Expected(
        BaseJSONSerializer,
        "_serialize_type_structure",
        "(self, serialized: 'Serialized', value: 'Any', shape: 'StructureShape', key: 'str') -> 'None'",
        ("super()._serialize_type_structure(serialized, value, shape, key)",),
    ),
    Expected(moto_responses, "method_names_from_class", "(clazz: 'object') -> 'list[str]'"),
)

EXPECTED_CACHES: tuple[Expected, ...] = (
    Expected(  # every KMS key, a symmetric one too, gets its signing key at its creation
        moto_kms_models,
        "generate_private_key",
        "(key_spec: str) -> moto.kms.utils.AbstractPrivateKey",
    ),
    Expected(
        Key,
        "__init__",
        "(self, policy: str | None, key_usage: str, key_spec: str, description: str, account_id: str, region: str, "
        "multi_region: bool = False, origin: str = 'AWS_KMS')",
        ("self.private_key = generate_private_key(self.key_spec)",),
    ),
    Expected(  # the keys the picker tries depend on the object's class, the key and the shape only
        AttributePicker,
        "__call__",
        "(self, context: 'AttributePickerContext') -> 'Any'",
        (
            "for possible_key in self.get_possible_keys(context):",
            'key_path = f"{context.key_path}.{context.key}"',
            "for transform_path, transform in self.response_transformers.items():",
            "if key_path.endswith(transform_path):",
            "value = transform(value)",
        ),
    ),
    Expected(  # each alias provider reads only these of the object: its Meta and its class's name
        moto_serialize,
        "DEFAULT_ALIAS_PROVIDERS",
        None,
    ),
    Expected(jsonpath_ng.ext, "parse", "(path: 'str', debug: 'bool | None' = None) -> 'JSONPath'"),
    Expected(sfn_json_path, "parse", "(path: 'str', debug: 'bool | None' = None) -> 'JSONPath'"),
    Expected(sfn_result_path, "parse", "(string: 'str') -> 'JSONPath'"),
    Expected(  # botocore, not moto: a local request's signature is never checked
        SigV4Auth,
        "add_auth",
        "(self, request)",
        (
            "canonical_request = self.canonical_request(request)",
            "signature = self.signature(string_to_sign, request)",
        ),
    ),
    Expected(SigV4Auth, "canonical_request", "(self, request)"),
    Expected(  # botocore: a session's loader is made by this module-level name, on first use
        botocore_session.Session,
        "_register_data_loader",
        "(self)",
        ("lambda: create_loader(self.get_config_variable('data_path')),",),
    ),
    Expected(botocore_session, "create_loader", "(search_path_string=None)"),
    Expected(  # moto's Lambda tasks ask this name (imported into the module) for their client
        sfn_lambda_eval,
        "_invoke_lambda_function",
        None,
        ("lambda_client = boto_client_for(", 'service="lambda", region=region, state_credentials=state_credentials'),
    ),
    Expected(
        sfn_lambda_eval,
        "boto_client_for",
        "(region: str, service: str, state_credentials: Any = None) -> botocore.client.BaseClient",
        ('aws_access_key_id="ak",', 'aws_secret_access_key="sk",'),
    ),
    Expected(  # a query reads its candidates from all_items() and sorts them itself afterwards
        DynamoTable,
        "query",
        "(self, hash_key: moto.dynamodb.models.dynamo_type.DynamoType | None, range_comparison: str | None, "
        "range_objs: list[moto.dynamodb.models.dynamo_type.DynamoType], limit: int, "
        "exclusive_start_key: dict[str, typing.Any], scan_index_forward: bool, "
        "projection_expressions: list[list[str]] | None, index_name: str | None = None, "
        "consistent_read: bool = False, filter_expression: Any = None, hash_key_conditions: list[tuple[str, "
        "moto.dynamodb.models.dynamo_type.DynamoType]] | None = None, range_key_conditions: list[tuple[str, "
        "str, list[moto.dynamodb.models.dynamo_type.DynamoType]]] | None = None, "
        "**filter_kwargs: Any) -> tuple[list[moto.dynamodb.models.dynamo_type.Item], int, dict[str, "
        "typing.Any] | None]",
        (
            "for item in self.all_items():",
            "possible_results = self.sorted_items(",
            "possible_results.sort(key=lambda item: item.range_key)  # type: ignore",
            "if isinstance(item, Item) and item.hash_key == hash_key",
        ),
    ),
    Expected(DynamoTable, "all_items", "(self) -> list[moto.dynamodb.models.dynamo_type.Item]"),
    Expected(SigV4Auth, "signature", "(self, string_to_sign, request)"),
)

EXPECTED_PARSERS: tuple[Expected, ...] = (
    Expected(  # a JSON template read as JSON (PyYAML's pure-Python loader was most of every deploy)
        CfnStack,
        "parse_template",
        "(template: 'str') -> 'dict[str, Any]'",
        ("return yaml.load(template, Loader=yaml.Loader)", "return json.loads(template)"),
    ),
    Expected(  # parsed once per definition; each execution still gets its own program from the tree
        asl_parser.AmazonStateLanguageParser,
        "parse",
        "(definition: str) -> tuple[moto.stepfunctions.parser.asl.component.eval_component.EvalComponent, "
        "antlr4.ParserRuleContext.ParserRuleContext]",
        ("tree = parser.state_machine()", "preprocessor = Preprocessor()", "program = preprocessor.visit(tree)"),
    ),
)


# --- speed -------------------------------------------------------------------------------------------

# DynamoDB's AttributeValue members (botocore's dynamodb service model) and what each holds
_SCALAR_MEMBERS = frozenset({"S", "N"})
_FLAG_MEMBERS = frozenset({"NULL", "BOOL"})
_ATTRIBUTE_VALUE_MEMBERS = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})


class _NotPlain(Exception):
    """An attribute value the direct path does not convert (moto's generic path takes it)."""


def _attribute_value_json(serializer: BaseJSONSerializer, value: Any) -> dict[str, Any]:
    """{"S": "x"} / {"M": {...}} / ... as DynamoDB's JSON protocol has it, exactly as moto's generic
    serializer writes it (blobs base64, numbers as strings, None members left out)."""
    if type(value) is not dict or not value.keys() <= _ATTRIBUTE_VALUE_MEMBERS:
        raise _NotPlain
    out: dict[str, Any] = {}
    for member, inner in value.items():
        if inner is None:
            continue
        if member in _SCALAR_MEMBERS:
            if type(inner) is not str:
                raise _NotPlain
            out[member] = inner
        elif member in _FLAG_MEMBERS:
            if type(inner) is not bool:
                raise _NotPlain
            out[member] = inner
        elif member == "B":
            if not isinstance(inner, bytes | str):
                raise _NotPlain
            out[member] = serializer._base64(inner)
        elif member in ("SS", "NS"):
            if type(inner) is not list or not all(type(i) is str for i in inner):
                raise _NotPlain
            out[member] = list(inner)
        elif member == "BS":
            if type(inner) is not list or not all(isinstance(i, bytes | str) for i in inner):
                raise _NotPlain
            out[member] = [serializer._base64(i) for i in inner]
        elif member == "M":
            if type(inner) is not dict:
                raise _NotPlain
            out[member] = {str(k): _attribute_value_json(serializer, v) for k, v in inner.items() if v is not None}
        else:  # "L"
            if type(inner) is not list:
                raise _NotPlain
            out[member] = [_attribute_value_json(serializer, v) for v in inner]
    return out


_ASL_TREES: dict[str, Any] = {}  # state machine definition -> its parse tree, for every replay of the process


def _patch_speed(patcher: _Patcher) -> None:
    original_structure: Callable[..., None] = patcher.original(BaseJSONSerializer, "_serialize_type_structure")

    def serialize_type_structure(self: BaseJSONSerializer, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and shape.members.keys() == _ATTRIBUTE_VALUE_MEMBERS:
            try:
                serialized[self.get_serialized_name(shape, key)] = _attribute_value_json(self, value)
                return
            except _NotPlain:
                pass
        original_structure(self, serialized, value, shape, key)

    patcher.replace(BaseJSONSerializer, "_serialize_type_structure", serialize_type_structure)

    original_names: Callable[[object], list[str]] = patcher.original(moto_responses, "method_names_from_class")
    names: dict[object, list[str]] = {}

    def method_names_from_class(clazz: object) -> list[str]:
        known = names.get(clazz)
        if known is None:
            known = names[clazz] = original_names(clazz)
        return list(known)

    patcher.replace(moto_responses, "method_names_from_class", method_names_from_class)

    # moto makes an RSA-2048 private key (80 ms) for every KMS key it creates, a symmetric one too, for
    # Sign/Verify/GetPublicKey: a deploy creates five (the stack's keys, DynamoDB's and EBS's default
    # keys) and nothing here signs. Made at its first use instead
    make_private_key = patcher.original(moto_kms_models, "generate_private_key")
    patcher.replace(
        moto_kms_models, "generate_private_key", lambda key_spec: _LazyPrivateKey(make_private_key, key_spec)
    )

    # CloudFormation reads a template as YAML first, JSON only if that fails: JSON is YAML, so a synthesized
    # template (JSON, 300 KB) goes through PyYAML's pure-Python loader, most of every deploy. JSON first
    # for a document that is one: the same dict (tests/local/test_patches_speed.py compares them)
    original_template: Callable[[str], dict[str, Any]] = patcher.original(CfnStack, "parse_template")

    def parse_template(template: str) -> dict[str, Any]:
        if template.lstrip().startswith("{"):
            try:
                parsed = json.loads(template)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                return parsed
        return original_template(template)

    patcher.replace(CfnStack, "parse_template", staticmethod(parse_template))

    # Step Functions parses a state machine's definition (ANTLR, in pure Python) at every
    # execution's start; the parse tree depends only on the text, and each execution's program (the
    # evaluation components, which hold state) is still built afresh from it, as moto does
    original_parse: Callable[[str], tuple[Any, Any]] = patcher.original(asl_parser.AmazonStateLanguageParser, "parse")
    trees = _ASL_TREES

    def parse(definition: str) -> tuple[Any, Any]:
        tree = trees.get(definition)
        if tree is None:
            program, tree = original_parse(definition)  # raises on a definition with syntax errors
            trees[definition] = tree
            return program, tree
        return Preprocessor().visit(tree), tree

    patcher.replace(asl_parser.AmazonStateLanguageParser, "parse", staticmethod(parse))

    # moto's generic serializer asks six alias providers, at every member of every object it answers with
    # (a DescribeInstances of 4 instances: about 4,000 times), which keys to try. Their answer depends
    # only on the object's class and `Meta`, the key and the shape (and the shape's parent): remembered
    # per those, with the shape kept alive so that its id cannot be reused by another
    keys_known: dict[tuple[Any, ...], tuple[Any, tuple[str, ...]]] = {}
    # A response class's transformers (its RESPONSE_KEY_PATH_TO_TRANSFORMER), kept alive, with how many it had,
    # and per key path the transformer's path that applies (or None): moto tried each suffix at every member.
    # Some responses add a transformer to the class's dict at a request (EC2's VPC peering): a new count
    # starts afresh
    transforms_known: dict[int, tuple[Mapping[str, Any], int, dict[str, str | None]]] = {}

    def pick(self: AttributePicker, context: AttributePickerContext) -> Any:
        obj, shape = context.obj, context.shape
        cache_key: tuple[Any, ...] = (type(self), tuple(self.alias_providers), type(obj), getattr(obj, "Meta", None))
        cache_key += (context.key, id(shape), id(getattr(shape, "parent", None)))
        known = keys_known.get(cache_key)
        if known is None or known[0] is not shape:
            known = keys_known[cache_key] = (shape, tuple(self.get_possible_keys(context)))
        value = None
        for possible_key in known[1]:
            found = moto_get_value(obj, possible_key, MOTO_MISSING)
            if found is not MOTO_MISSING:
                value = found
                break
        transformers = self.response_transformers
        if transformers:  # as moto applies them: the first whose path ends the member's, found once per path
            known_paths = transforms_known.get(id(transformers))
            if known_paths is None or known_paths[0] is not transformers or known_paths[1] != len(transformers):
                known_paths = transforms_known[id(transformers)] = (transformers, len(transformers), {})
            key_path = f"{context.key_path}.{context.key}"  # shape names and keys: a bounded set
            if key_path in known_paths[2]:
                path = known_paths[2][key_path]
            else:
                path = known_paths[2][key_path] = next((p for p in transformers if key_path.endswith(p)), None)
            if path is not None:
                return transformers[path](value)  # looked up now: a response may set its own at each request
        return value

    patcher.replace(AttributePicker, "__call__", pick)

    # jsonpath_ng's `parse` builds its PLY parser (the grammar's tables) at every call: moto's event input
    # transformer and Step Functions' paths call it per event and per state. A parsed path is immutable
    # (find and update_or_create read it only): parsed once per text
    def cached(parse: Callable[[str], Any]) -> Callable[[str], Any]:
        parsed: dict[str, Any] = {}

        def parse_once(path: str, debug: bool | None = None) -> Any:
            known = parsed.get(path)
            if known is None:
                known = parsed[path] = parse(path)
            return known

        return parse_once

    ext_parse = cached(patcher.original(jsonpath_ng.ext, "parse"))
    patcher.replace(jsonpath_ng.ext, "parse", ext_parse)  # moto.events.utils imports it at each call
    patcher.replace(sfn_json_path, "parse", ext_parse)
    patcher.replace(sfn_result_path, "parse", cached(patcher.original(sfn_result_path, "parse")))

    # botocore signs every request (SigV4: the canonical request, hashing the payload, five HMACs): moto
    # checks no signature (IAM authorization is off here), only the Authorization header's credential scope
    # (account and region), which botocore still writes. The signature is left as a fixed string
    patcher.replace(SigV4Auth, "canonical_request", lambda self, request: f"{request.method} {request.url}")
    patcher.replace(SigV4Auth, "signature", lambda self, string_to_sign, request: "0" * 64)

    _patch_clients(patcher)
    _patch_dynamodb_query(patcher)


class _LazyPrivateKey:
    """A KMS key's private key, generated when the key first signs, verifies or gives its public key."""

    def __init__(self, make: Callable[[str], Any], key_spec: str) -> None:
        self._make = make
        self._key_spec = key_spec
        self._key: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        with self._lock:
            if self._key is None:
                self._key = self._make(self._key_spec)
        return getattr(self._key, name)


_LOADERS: dict[str | None, Any] = {}  # search path -> botocore's data loader (read-only data: the service models)


class _SearchPaths(list[str]):
    """A shared loader's search paths: each boto3 Session appends its own data directory to its loader's
    list, which, shared, would grow by one entry per session."""

    def append(self, path: str) -> None:
        if path not in self:
            super().append(path)


def _patch_clients(patcher: _Patcher) -> None:
    """Clients made in less time: a replay makes hundreds (an instance's job-scoped clients, and one per
    Lambda task of every execution)."""
    # Every botocore Session makes its own data loader, so every session's first client reads and decodes the
    # service model's JSON again. The loader's files are read-only data: one loader per search path serves
    # every session
    original_loader: Callable[..., Any] = patcher.original(botocore_session, "create_loader")
    loaders = _LOADERS  # kept from one installation to the next: each runtime's clients would decode it all again

    def create_loader(search_path_string: str | None = None) -> Any:
        loader = loaders.get(search_path_string)
        if loader is None:
            loader = loaders[search_path_string] = original_loader(search_path_string)
            loader._search_paths = _SearchPaths(loader.search_paths)
        return loader

    patcher.replace(botocore_session, "create_loader", create_loader)

    # moto's Step Functions makes a new boto3 client for every Lambda task it runs, always with
    # the same fixed keys (it ignores the task's credentials): one per region and service, reused
    original_client: Callable[..., Any] = patcher.original(sfn_lambda_eval, "boto_client_for")
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with lock:
            client = clients.get((region, service))
            if client is None:
                client = clients[(region, service)] = original_client(region, service)
        return client

    patcher.replace(sfn_lambda_eval, "boto_client_for", boto_client_for)


_QUERY_SCOPE = threading.local()  # (table, its candidates) while this thread's Query runs


def _patch_dynamodb_query(patcher: _Patcher) -> None:
    """moto's Query takes its candidates from `Table.all_items()`: every item of the table, sorted, at each
    Query (a table of 4,000 items: 4,000 key comparisons and a sort, for the ten items of one partition).
    It sorts the candidates itself afterwards (by the table's or the index's keys), so their order does not
    matter, only which they are: a table Query gets its partition's items; an index Query the items whose
    index hash attributes are equal (DynamoType's own equality: type and cast value) to the condition's,
    without the sort. moto's own checks then run on those as on all. Other readers of all_items (Scan, a
    Query of another table or in another thread) get moto's answer."""
    original_all: Callable[[DynamoTable], list[Any]] = patcher.original(DynamoTable, "all_items")
    original_query: Callable[..., Any] = patcher.original(DynamoTable, "query")

    def all_items(self: DynamoTable) -> list[Any]:
        scope = getattr(_QUERY_SCOPE, "table", None)
        if scope is not None and scope[0] is self:
            return cast(list[Any], scope[1]())
        return original_all(self)

    def query(self: DynamoTable, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        conditions: list[tuple[str, DynamoType]] = list(kwargs.get("hash_key_conditions") or [])

        def partition() -> list[Any]:
            held = self.items.get(hash_key)
            if held is None:
                return []
            return list(held.values()) if self.range_key_attr else [held]

        def matching() -> list[Any]:
            found: list[Any] = []
            held: Any
            for held in self.items.values():
                for item in held.values() if self.range_key_attr else (held,):
                    for name, wanted in conditions:
                        value = item.attrs.get(name)
                        if value is None or value.type != wanted.type or value.cast_value != wanted.cast_value:
                            break
                    else:
                        found.append(item)
            return found

        if index_name:
            if not conditions:
                return original_query(self, hash_key, *args, **kwargs)
            candidates = matching
        else:
            if hash_key is None:
                return original_query(self, hash_key, *args, **kwargs)
            candidates = partition
        _QUERY_SCOPE.table = (self, candidates)
        try:
            return original_query(self, hash_key, *args, **kwargs)
        finally:
            _QUERY_SCOPE.table = None

    patcher.replace(DynamoTable, "all_items", all_items)
    patcher.replace(DynamoTable, "query", query)
