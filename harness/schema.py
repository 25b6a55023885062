"""The JSON Schemas in schemas/: loading them and turning violations into one-line messages."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from harness import SCHEMAS, KitError

#: Schema names and the format_version each one describes.
SCHEMA_NAMES = ("manifest", "result", "run", "summary", "build")


@functools.cache
def load(name: str) -> dict[str, Any]:
    """Load schemas/<name>.schema.json."""
    path = SCHEMAS / f"{name}.schema.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise KitError(f"{path}: schema file missing") from None


@functools.cache
def validator(name: str) -> Draft202012Validator:
    schema = load(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def field_path(parts: Iterable[Any]) -> str:
    """['strategies', 2, 'spec_type'] -> 'strategies[2].spec_type'."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _message(error: jsonschema.ValidationError) -> str:
    where = field_path(error.absolute_path)
    if error.validator == "additionalProperties":
        return f"{where}: {error.message}"
    if error.validator == "required":
        return f"{where}: {error.message}"
    if error.validator == "enum":
        return f"{where}: {error.instance!r} is not one of {error.validator_value!r}"
    if error.validator == "const":
        return f"{where}: expected {error.validator_value!r}, got {error.instance!r}"
    if error.validator == "pattern":
        return f"{where}: {error.instance!r} does not match {error.validator_value!r}"
    if error.validator == "type":
        return f"{where}: expected {error.validator_value}, got {type(error.instance).__name__} {error.instance!r}"
    return f"{where}: {error.message}"


def errors(name: str, instance: Any) -> list[str]:
    """All violations of schema `name` by `instance`, one line each, in document order."""
    found = sorted(validator(name).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    return [_message(e) for e in found]


def check(name: str, instance: Any, where: str) -> None:
    """Raise KitError naming `where` and the first violation (and how many more) if `instance` is invalid."""
    found = errors(name, instance)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KitError(f"{where}: {found[0]}{more}")
