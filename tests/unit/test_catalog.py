"""The GPU catalog: every required instance type is present and its facts agree with its GPU model."""

from __future__ import annotations

import pytest

from spotrelay.catalog import GPU_MODELS, INSTANCE_TYPES, REFERENCE_GPU, InstanceType, relative_speed

REQUIRED_TYPES = {
    "g4dn": ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "metal"],
    "g5": ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"],
    "g6": ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"],
    "g6e": ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"],
    "gr6": ["4xlarge", "8xlarge"],
    "p3": ["2xlarge", "8xlarge", "16xlarge"],
    "p3dn": ["24xlarge"],
    "p4d": ["24xlarge"],
    "p4de": ["24xlarge"],
    "p5": ["4xlarge", "48xlarge"],
    "p5e": ["48xlarge"],
    "p5en": ["48xlarge"],
    "p6-b200": ["48xlarge"],
}
REQUIRED_NAMES = sorted(f"{family}.{size}" for family, sizes in REQUIRED_TYPES.items() for size in sizes)

REQUIRED_GPU_MODELS = {
    "T4",
    "A10G",
    "L4",
    "L40S",
    "V100",
    "V100-32GB",
    "A100",
    "A100-80GB",
    "H100",
    "H200",
    "B200",
}

ALL_TYPES = sorted(INSTANCE_TYPES.values(), key=lambda t: t.name)


def _ids(t: InstanceType) -> str:
    return t.name


def test_every_required_instance_type_is_present() -> None:
    # Given the families and sizes the scheduler must be able to place on
    # When the catalog is loaded
    missing = [name for name in REQUIRED_NAMES if name not in INSTANCE_TYPES]
    # Then none of them is missing
    assert missing == []
    assert len(REQUIRED_NAMES) == 44


def test_every_required_gpu_model_is_present() -> None:
    # Given the GPU names a job spec's gpu_models may use
    # When the GPU table is loaded
    # Then exactly those models are there, each keyed by its own name
    assert set(GPU_MODELS) == REQUIRED_GPU_MODELS
    assert all(model.name == key for key, model in GPU_MODELS.items())


@pytest.mark.parametrize("instance_type", ALL_TYPES, ids=_ids)
def test_instance_type_is_keyed_by_name_and_family(instance_type: InstanceType) -> None:
    # Given a catalog entry
    # When its key and family are read
    # Then the key is the type's own name and the family is one of the required families
    assert INSTANCE_TYPES[instance_type.name] is instance_type
    assert instance_type.family in REQUIRED_TYPES


@pytest.mark.parametrize("instance_type", ALL_TYPES, ids=_ids)
def test_instance_gpu_model_is_known_and_memory_matches(instance_type: InstanceType) -> None:
    # Given an instance type
    # When its GPU model is looked up
    model = GPU_MODELS.get(instance_type.gpu_model)
    # Then the model exists and the per-GPU memory agrees with the model's (within rounding)
    assert model is not None, f"{instance_type.name}: unknown GPU model {instance_type.gpu_model!r}"
    assert instance_type.gpu_memory_gib == pytest.approx(model.memory_gib, abs=0.05)


@pytest.mark.parametrize("family", sorted(REQUIRED_TYPES))
def test_every_size_of_a_family_carries_the_same_gpu(family: str) -> None:
    # Given all sizes of one family
    members = [t for t in INSTANCE_TYPES.values() if t.family == family]
    # When their GPU model and per-GPU memory are compared
    # Then they are the same across the family
    assert len({t.gpu_model for t in members}) == 1
    assert len({t.gpu_memory_gib for t in members}) == 1


def test_reference_gpu_is_v100_with_speed_one() -> None:
    # Given the reference GPU
    # When its relative speed is read
    # Then it is the V100 at exactly 1.0
    assert REFERENCE_GPU == "V100"
    assert GPU_MODELS["V100"].relative_speed == 1.0


@pytest.mark.parametrize("name", sorted(REQUIRED_GPU_MODELS))
def test_relative_speed_is_dense_tflops_over_reference(name: str) -> None:
    # Given a GPU model and the reference GPU's dense TFLOPS
    reference = GPU_MODELS[REFERENCE_GPU].dense_tflops
    # When its relative speed is read
    # Then it is its dense TFLOPS divided by the reference's
    assert GPU_MODELS[name].relative_speed == pytest.approx(GPU_MODELS[name].dense_tflops / reference)


def test_generations_are_ordered_by_speed() -> None:
    # Given the relative speeds of the GPU generations
    speed = {name: model.relative_speed for name, model in GPU_MODELS.items()}
    # When they are compared
    # Then newer datacenter parts are faster: B200 > H100 > A100 > V100 > T4
    assert speed["B200"] > speed["H100"] > speed["A100"] > speed["V100"] > speed["T4"]
    assert speed["L40S"] > speed["L4"]
    assert speed["H200"] == speed["H100"]  # same GH100 compute, more memory


def test_instance_relative_speed_follows_its_gpu() -> None:
    # Given a p5 and a p3 instance
    # When relative_speed is asked per instance type
    # Then it is the GPU's relative speed
    assert relative_speed(INSTANCE_TYPES["p5.48xlarge"]) == GPU_MODELS["H100"].relative_speed
    assert relative_speed(INSTANCE_TYPES["p3.2xlarge"]) == 1.0


def test_p5_4xlarge_has_one_h100() -> None:
    # Given the single-GPU p5 size
    t = INSTANCE_TYPES["p5.4xlarge"]
    # When its GPUs are read
    # Then it carries exactly one 80 GiB H100
    assert (t.gpu_model, t.gpu_count) == ("H100", 1)
    assert t.gpu_memory_gib == pytest.approx(80)


@pytest.mark.parametrize(
    ("name", "gpu_model", "gpu_count"),
    [
        ("g4dn.12xlarge", "T4", 4),
        ("g4dn.metal", "T4", 8),
        ("g5.48xlarge", "A10G", 8),
        ("g6.24xlarge", "L4", 4),
        ("g6e.12xlarge", "L40S", 4),
        ("gr6.8xlarge", "L4", 1),
        ("p3dn.24xlarge", "V100-32GB", 8),
        ("p4de.24xlarge", "A100-80GB", 8),
        ("p5e.48xlarge", "H200", 8),
        ("p6-b200.48xlarge", "B200", 8),
    ],
)
def test_multi_gpu_and_variant_types(name: str, gpu_model: str, gpu_count: int) -> None:
    # Given an instance type whose GPU model or count is easy to get wrong
    t = INSTANCE_TYPES[name]
    # When its GPUs are read
    # Then they match AWS's listing
    assert (t.gpu_model, t.gpu_count) == (gpu_model, gpu_count)


@pytest.mark.parametrize("instance_type", ALL_TYPES, ids=_ids)
def test_prices_are_positive_where_present(instance_type: InstanceType) -> None:
    # Given an instance type's on-demand price
    price = instance_type.on_demand_usd_per_hour
    # When it is present
    # Then it is a positive hourly price below any real GPU instance's ceiling
    if price is not None:
        assert 0 < price < 200


def test_only_capacity_block_types_have_no_on_demand_price() -> None:
    # Given the catalog
    # When the types without an on-demand price are collected
    unpriced = sorted(t.name for t in INSTANCE_TYPES.values() if t.on_demand_usd_per_hour is None)
    # Then only p5e (sold through Capacity Blocks) lacks one
    assert unpriced == ["p5e.48xlarge"]


@pytest.mark.parametrize(
    ("name", "price"),
    [
        ("g4dn.xlarge", 0.526),
        ("g5.xlarge", 1.006),
        ("g6.xlarge", 0.8048),
        ("g6e.xlarge", 1.861),
        ("gr6.4xlarge", 1.5392),
        ("p3.2xlarge", 3.06),
        ("p5.48xlarge", 55.04),
    ],
)
def test_well_known_us_east_1_prices(name: str, price: float) -> None:
    # Given a widely quoted us-east-1 Linux on-demand price
    # When the catalog's price for that type is read
    # Then it matches
    assert INSTANCE_TYPES[name].on_demand_usd_per_hour == pytest.approx(price)


@pytest.mark.parametrize("family", ["g4dn", "g5", "g6", "g6e", "gr6"])
def test_price_grows_with_size_for_single_gpu_sizes(family: str) -> None:
    # Given the sizes of a family that carry one GPU
    singles = sorted(
        (t for t in INSTANCE_TYPES.values() if t.family == family and t.gpu_count == 1), key=lambda t: t.vcpus
    )
    prices = [t.on_demand_usd_per_hour for t in singles]
    # When they are ordered by vCPUs
    known = [p for p in prices if p is not None]
    # Then each is priced and the price rises with them (a transposed row would break this)
    assert len(known) == len(prices) >= 2
    assert known == sorted(known)
