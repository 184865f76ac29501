"""The speed patches give the answers stock moto gives: every DynamoDB call that returns items, with
every kind of attribute value, answered the same with and without them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
from boto3.dynamodb.types import Binary
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.core import responses as moto_responses
from moto.core.serialize import BaseJSONSerializer
from moto.kms.models import kms_backends as moto_kms_backends

from spotrelay.local import patches

REGION = "eu-west-1"
TABLE = "items"

RICH_ITEM: dict[str, Any] = {
    "pk": "job#1",
    "sk": "attempt#0001",
    "text": "héllo \u2603",
    "empty": "",
    "number": Decimal("12.5"),
    "big": Decimal("123456789012345678901234567890"),
    "yes": True,
    "no": False,
    "nothing": None,
    "blob": Binary(b"\x00\xffbinary"),
    "strings": {"a", "b"},
    "numbers": {Decimal(1), Decimal("2.5")},
    "blobs": {Binary(b"x"), Binary(b"\x01")},
    "list": ["a", Decimal(1), None, [True, {"deep": {"deeper": [b"\x02"]}}], {}],
    "map": {"pool": {"zone": "eu-west-1a", "price": Decimal("0.918")}, "empty": {}, "none": None},
}


@contextmanager
def table(speed: bool) -> Iterator[Any]:
    with mock_aws():
        patcher = patches._Patcher()
        if speed:
            patches._patch_speed(patcher)
        try:
            resource = boto3.resource("dynamodb", region_name=REGION)
            made = resource.create_table(
                TableName=TABLE,
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                BillingMode="PAY_PER_REQUEST",
            )
            yield made
        finally:
            patcher.undo()


def answers(speed: bool, item: dict[str, Any]) -> list[Any]:
    """What a client sees of each item-returning call (its ResponseMetadata left out)."""
    calls: list[Callable[[Any], Any]] = [
        lambda t: t.put_item(Item=item, ReturnValues="ALL_OLD"),
        lambda t: t.put_item(Item=item, ReturnValues="ALL_OLD"),
        lambda t: t.get_item(Key={"pk": item["pk"], "sk": item["sk"]}),
        lambda t: t.get_item(Key={"pk": item["pk"], "sk": "missing"}),
        lambda t: t.query(KeyConditionExpression="pk = :pk", ExpressionAttributeValues={":pk": item["pk"]}),
        lambda t: t.scan(),
        lambda t: t.update_item(
            Key={"pk": item["pk"], "sk": item["sk"]},
            UpdateExpression="SET touched = :t",
            ExpressionAttributeValues={":t": Decimal(1)},
            ReturnValues="ALL_NEW",
        ),
        lambda t: t.delete_item(Key={"pk": item["pk"], "sk": item["sk"]}, ReturnValues="ALL_OLD"),
    ]
    with table(speed) as made:
        seen = []
        for call in calls:
            response = call(made)
            response.pop("ResponseMetadata", None)
            seen.append(response)
        return seen


def test_every_kind_of_attribute_value_is_answered_as_stock_moto_answers_it() -> None:
    # Given an item with every kind of DynamoDB attribute value, nested, empty and binary ones included
    # When the same calls are made against stock moto and against moto with the speed patches
    stock, fast = answers(False, RICH_ITEM), answers(True, RICH_ITEM)
    # Then every answer is the same, and the item came back as it was written
    assert fast == stock
    assert fast[2]["Item"]["blob"] == Binary(b"\x00\xffbinary")
    assert fast[2]["Item"]["list"][3][1] == {"deep": {"deeper": [Binary(b"\x02")]}}


def test_the_patches_take_the_fast_path() -> None:
    # Given the speed patches installed, Then the serializer and the method lookup are the patched ones
    patcher = patches._Patcher()
    stock_structure = BaseJSONSerializer._serialize_type_structure
    stock_names = vars(moto_responses)["method_names_from_class"]
    patches._patch_speed(patcher)
    try:
        assert BaseJSONSerializer._serialize_type_structure is not stock_structure
        names = vars(moto_responses)["method_names_from_class"]
        assert names is not stock_names
        assert names(dict) == stock_names(dict)
    finally:
        patcher.undo()
    # And undoing them restores moto
    assert BaseJSONSerializer._serialize_type_structure is stock_structure
    assert vars(moto_responses)["method_names_from_class"] is stock_names


values = st.recursive(
    st.none()
    | st.booleans()
    | st.text(max_size=8)
    | st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-1000, max_value=1000)
    | st.binary(min_size=1, max_size=8).map(Binary),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=4), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: k not in ("pk", "sk")), values, max_size=5))
def test_any_item_is_answered_as_stock_moto_answers_it(attributes: dict[str, Any]) -> None:
    item = {"pk": "p", "sk": "s", **attributes}
    assert answers(True, item) == answers(False, item)


def test_a_json_template_reads_as_the_dict_cloudformation_reads_from_yaml(synthesized_template: Path) -> None:
    import yaml
    from moto.cloudformation.models import Stack
    from moto.cloudformation.utils import yaml_tag_constructor

    text = synthesized_template.read_text()
    yaml.add_multi_constructor("", yaml_tag_constructor)
    stock = yaml.load(text, Loader=yaml.Loader)  # what moto's parse_template reads a JSON template with
    patcher = patches._Patcher()
    patches._patch_speed(patcher)
    try:
        assert Stack.parse_template(text) == stock
        assert Stack.parse_template("Resources:\n  Q: {Type: AWS::SQS::Queue}\n") == {
            "Resources": {"Q": {"Type": "AWS::SQS::Queue"}}
        }  # YAML is still YAML
    finally:
        patcher.undo()


def test_ec2_answers_as_stock_moto_answers_with_its_response_transformers() -> None:
    with mock_aws():
        # Given tagged on-demand and spot instances
        ec2: Any = boto3.client("ec2", region_name=REGION)
        image = ec2.describe_images()["Images"][0]["ImageId"]
        tags = [{"ResourceType": "instance", "Tags": [{"Key": "spotrelay:job", "Value": "train-1"}]}]
        ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2, InstanceType="p3.2xlarge", TagSpecifications=tags)
        spot = {"MarketType": "spot"}
        ec2.run_instances(
            ImageId=image,
            MinCount=1,
            MaxCount=1,
            InstanceType="g5.xlarge",
            InstanceMarketOptions=spot,
            TagSpecifications=tags,
        )

        def answers() -> list[Any]:  # XML, with moto's response transformers (Image.CreationDate is one)
            return [
                ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["spotrelay:job"]}])["Reservations"],
                ec2.describe_instance_status(IncludeAllInstances=True)["InstanceStatuses"],
                ec2.describe_tags()["Tags"],
                ec2.describe_images(ImageIds=[image])["Images"],
            ]

        # When the same instances are described by stock moto, then with the speed patches
        stock = answers()
        patcher = patches._Patcher()
        patches._patch_speed(patcher)
        try:
            fast, again = answers(), answers()  # the second from what the first remembered
        finally:
            patcher.undo()
    # Then every answer is the same, the values moto's transformers write included
    assert fast == stock
    assert again == stock
    assert [i.get("InstanceLifecycle") for r in fast[0] for i in r["Instances"]] == [None, None, "spot"]
    assert isinstance(fast[3][0]["CreationDate"], str)


def test_a_kms_key_makes_its_private_key_only_when_it_signs_and_signs_as_stock_moto_does() -> None:
    with mock_aws():
        kms = boto3.client("kms", region_name=REGION)
        patcher = patches._Patcher()
        patches._patch_speed(patcher)
        try:
            # Given keys created with the speed patches: a symmetric one (the stack's) and a signing one
            symmetric = kms.create_key()["KeyMetadata"]["KeyId"]
            signing = kms.create_key(KeyUsage="SIGN_VERIFY", KeySpec="RSA_2048")["KeyMetadata"]["KeyId"]
            backend = moto_kms_backends["123456789012"][REGION]
            # Then neither has made its RSA key yet
            assert not any(_made(k) for k in backend.keys.values())
            # And the symmetric key encrypts and decrypts as ever
            blob = kms.encrypt(KeyId=symmetric, Plaintext=b"checkpoint")["CiphertextBlob"]
            assert kms.decrypt(CiphertextBlob=blob)["Plaintext"] == b"checkpoint"
            # When the signing key signs, Then its signature verifies with its own public key
            signature = kms.sign(KeyId=signing, Message=b"m", SigningAlgorithm="RSASSA_PSS_SHA_256")["Signature"]
            verified = kms.verify(
                KeyId=signing, Message=b"m", Signature=signature, SigningAlgorithm="RSASSA_PSS_SHA_256"
            )
            assert verified["SignatureValid"] is True
            public = serialization.load_der_public_key(kms.get_public_key(KeyId=signing)["PublicKey"])
            assert isinstance(public, rsa.RSAPublicKey)
            assert public.key_size == 2048
            assert _made(backend.keys[signing])
            assert not _made(backend.keys[symmetric])
        finally:
            patcher.undo()


def _made(key: Any) -> bool:
    """Whether a KMS key's RSA private key exists (stock moto's always does)."""
    private = key.private_key
    return not isinstance(private, patches._LazyPrivateKey) or private._key is not None
