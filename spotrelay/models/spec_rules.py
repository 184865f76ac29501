"""What a job spec's values may be beyond their types: rules with their sources, checked by the spec's
validators (spotrelay.models.spec_sections, spotrelay.models.job_spec) at submission.

An image reference by distribution/reference's grammar (what docker would pull, never one of its options),
instance tags within EC2's and IMDS's rules, environment variable names, no control characters, and no
checkpoint directory among the system's own. Siblings: spec_errors (how a refusal is reported), documents
(reading a file or message within bounds).
"""

from __future__ import annotations

import re
import unicodedata

from spotrelay.models.spec_errors import _shown

# Top-level directories of the instance's own files, where a job's checkpoint dir may not be (/mnt, /data,
# /scratch, /home, /opt/<job>, /ckpt are the job's to use)
SYSTEM_DIRECTORIES = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root", "sbin", "sys", "usr"}
)


def _control_character(text: str, allowed: str = "") -> str | None:
    """The first C0/C1 control character (or DEL) of `text` not in `allowed`, or None."""
    return next((c for c in text if (c < " " or "\x7f" <= c <= "\x9f") and c not in allowed), None)


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # POSIX's portable environment variable names

# An image reference, by the grammar docker and containerd parse it with: distribution/reference
# (https://github.com/distribution/reference, reference.go's grammar and regexp.go's patterns):
#   reference := name [":" tag] ["@" digest];  name := [domain "/"] path-component ["/" path-component]*
#   domain := host [":" port];  host := domain-component ["." domain-component]* | "[" IPv6 "]"
#   path-component := [a-z0-9]+ (separator [a-z0-9]+)*;  separator := [_.] | __ | -+
#   tag := [\w][\w.-]{0,127};  digest := algorithm ":" hex{32,}, e.g. sha256:<64 hex>
# None of them may start with `-`, so an image is never read as one of docker's options. Go's \w is ASCII.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>[\w][\w.-]{{0,127}}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
IMAGE_PATH_MAX_CHARS = 255  # distribution/reference's RepositoryNameTotalLengthMax (the name after the domain)
# Longer than any reference the grammar's own bounds allow in practice (a 253-character host, a 255-character
# name, a 128-character tag, a sha512 digest): checked before the pattern runs
IMAGE_REFERENCE_MAX_CHARS = 1024
IMAGE_REFERENCE_FORM = (
    "use [registry[:port]/]name[:tag][@sha256:<hex>], e.g. nvcr.io/nvidia/pytorch:24.05-py3 or "
    "python@sha256:<64 hex digits>; the name is lower-case letters and digits, separated by / . _ or -"
)

# EC2's tag restrictions (Amazon EC2 User Guide, "Tag your Amazon EC2 resources", "Tag restrictions":
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions): at most 50 tags on
# a resource, a key of 1 to 128 characters, a value of 0 to 256, letters, numbers, spaces and + - = . _ : / @
# (EC2 itself takes more, but other services and IMDS tag access do not), no key starting with aws:
# (reserved for AWS, in any case).
TAG_KEY_MAX_CHARS = 128
TAG_VALUE_MAX_CHARS = 256
TAG_PUNCTUATION = "+-=._:/@"
# Of the 50, a worker instance already carries 6: spotrelay:managed, spotrelay:job-id, spotrelay:attempt,
# spotrelay:job-name and Name (spotrelay/aws/compute.py), and the stack's project tag (stacks/, through the
# launch template)
INSTANCE_TAGS_MAX = 50
SPOTRELAY_INSTANCE_TAGS = 6
JOB_TAGS_MAX = INSTANCE_TAGS_MAX - SPOTRELAY_INSTANCE_TAGS
RESERVED_TAG_PREFIXES = ("aws:", "spotrelay:")  # AWS's own, and the tags spotrelay finds its instances by
# The worker's launch template lets the agent read its instance's tags from IMDS (stacks/worker_construct.py,
# instance_metadata_tags), and then EC2 refuses to launch an instance with a tag key of other characters than
# a-z A-Z 0-9 + - = . , _ : @ (no space, no /), or that is `.`, `..` or `_index` (Amazon EC2 User Guide, "View
# tags for your EC2 instances using instance metadata"): such a key would make every launch of the job fail.
IMDS_TAG_KEY = re.compile(r"[A-Za-z0-9+\-=._:@]+")  # the characters both rules allow in a key
IMDS_TAG_KEYS_FORBIDDEN = (".", "..", "_index")


def image_reference_problem(image: str) -> str | None:
    """What makes `image` not an image reference docker would pull, or None if it is one."""
    if len(image) > IMAGE_REFERENCE_MAX_CHARS:
        return f"{len(image)} characters is not an image reference; {IMAGE_REFERENCE_FORM}"
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None:
        if image.startswith("-"):
            return f"{_shown(image)} starts with -, which docker would read as an option; {IMAGE_REFERENCE_FORM}"
        if IMAGE_REFERENCE.fullmatch(image.lower()) is not None:
            return f"{_shown(image)}: the repository name must be lower case; {IMAGE_REFERENCE_FORM}"
        return f"{_shown(image)} is not an image reference; {IMAGE_REFERENCE_FORM}"
    if len(match["path"]) > IMAGE_PATH_MAX_CHARS:
        return f"the name after the registry is longer than {IMAGE_PATH_MAX_CHARS} characters; {IMAGE_REFERENCE_FORM}"
    return None


def tag_problem(key: str, value: str) -> str | None:
    """What EC2 (or spotrelay) would refuse about the instance tag `key: value`, or None."""
    if not 1 <= len(key) <= TAG_KEY_MAX_CHARS:
        return f"a tag key is 1 to {TAG_KEY_MAX_CHARS} characters (got {len(key)})"
    if len(value) > TAG_VALUE_MAX_CHARS:
        return f"a tag value is at most {TAG_VALUE_MAX_CHARS} characters (got {len(value)})"
    if key in IMDS_TAG_KEYS_FORBIDDEN or not IMDS_TAG_KEY.fullmatch(key):
        return (
            "a tag key is ASCII letters, digits and + - = . _ : @ (no space, no /), and not . .. or _index: the "
            "workers read their tags from instance metadata, and EC2 launches no instance with another key then"
        )
    reserved = next((p for p in RESERVED_TAG_PREFIXES if key.lower().startswith(p)), None)
    if reserved is not None:
        return f"keys starting with {reserved} are reserved (for AWS and for spotrelay's own tags)"
    for what, text in (("key", key), ("value", value)):
        odd = next((c for c in text if not _tag_character(c)), None)
        if odd is not None:
            return f"the tag {what} holds {odd!r}: use letters, numbers, spaces and {' '.join(TAG_PUNCTUATION)}"
    return None


def _tag_character(char: str) -> bool:
    return char.isalnum() or unicodedata.category(char) == "Zs" or char in TAG_PUNCTUATION
