"""The file formats: the JSON Schemas in schemas/, the version each file is written in, and the upgrade of older
versions on read (one function per old version). Violations become one-line messages."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.validators import extend

from harness import SCHEMAS, KitError
from harness import formatter as fm

#: The format version each file is written in now; the schema of the same name describes it.
FORMAT_VERSIONS: dict[str, int] = {"manifest": 1, "result": 2, "run": 2, "summary": 3, "build": 1, "bundle": 1,
                                  "samples": 1, "answers": 1}

#: An upgrade: a file's object in one version -> the same object in the next.
Upgrade = Callable[[dict[str, Any]], dict[str, Any]]
#: (name, old version) -> its upgrade.
_UPGRADES: dict[tuple[str, int], Upgrade] = {}


def upgrade(name: str, version: int) -> Callable:
    """Register the upgrade of `name` files from `version` to `version + 1`."""
    def register(fn: Upgrade) -> Upgrade:
        _UPGRADES[(name, version)] = fn
        return fn
    return register


@functools.cache
def load(name: str) -> dict[str, Any]:
    """Load schemas/<name>.schema.json."""
    path = SCHEMAS / f"{name}.schema.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise KitError(f"{path}: schema file missing") from None


#: The largest magnitude a number in a file may have: far above any rate, time or size the kit records, far below
#: what overflows arithmetic (1e308 squared, exp of it); integers stay within 64 bits.
MAX_NUMBER = 1e15
MAX_INTEGER = 1 << 63


def _number_in_bounds(x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return False
    if isinstance(x, int):
        return -MAX_INTEGER < x < MAX_INTEGER
    return math.isfinite(x) and abs(x) <= MAX_NUMBER


def _is_number(checker: Any, x: Any) -> bool:
    """JSON numbers, without NaN and Infinity (Python's json reads both literals) and within MAX_NUMBER."""
    return _number_in_bounds(x)


def _is_integer(checker: Any, x: Any) -> bool:
    """A whole number written as one: 4.0 where a count belongs is refused (it would reach range() or a format
    string as a float), and so is a bool (JSON's true is not 1)."""
    return isinstance(x, int) and _number_in_bounds(x)


@functools.lru_cache(maxsize=512)
def python_pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema (ECMA-262) pattern as a Python regex: an unescaped `$` outside a character class becomes
    `\\Z`, because Python's `$` also matches before a final newline and ECMA's does not ("name\\n" must fail
    `^[a-z]+$`)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return re.compile("".join(out))


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not python_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = extend(Draft202012Validator, validators={"pattern": _pattern},
                    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many(
                        {"number": _is_number, "integer": _is_integer}))


@functools.cache
def validator(name: str) -> Draft202012Validator:
    schema = load(name)
    Draft202012Validator.check_schema(schema)
    return _Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def field_path(parts: Iterable[Any]) -> str:
    """['strategies', 2, 'spec_type'] -> 'strategies[2].spec_type'."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message(error: jsonschema.ValidationError) -> str:
    where = field_path(error.absolute_path)
    if error.validator == "enum":
        return f"{where}: {_short(error.instance)} is not one of {error.validator_value!r}"
    if error.validator == "const":
        return f"{where}: expected {error.validator_value!r}, got {_short(error.instance)}"
    if error.validator == "pattern":
        return f"{where}: {_short(error.instance)} does not match {error.validator_value!r}"
    if error.validator == "type":
        if isinstance(error.instance, int | float) and not isinstance(error.instance, bool) \
                and not _number_in_bounds(error.instance):
            return (f"{where}: {_short(error.instance)} is not a finite number within ±{fm.plain(MAX_NUMBER)} "
                    f"(expected {error.validator_value})")
        got = f"{type(error.instance).__name__} {_short(error.instance)}"
        kinds = error.validator_value
        wanted = " or ".join(str(k) for k in kinds) if isinstance(kinds, list) else kinds
        return f"{where}: expected {wanted}, got {got}"
    bound = {"minimum": "expected at least {v}, got {x}", "maximum": "expected at most {v}, got {x}",
             "exclusiveMinimum": "expected more than {v}, got {x}",
             "exclusiveMaximum": "expected less than {v}, got {x}",
             "maxLength": "longer than {v} characters", "minLength": "shorter than {v} characters",
             "maxItems": "more than {v} items", "minItems": "fewer than {v} items",
             "maxProperties": "more than {v} entries"}.get(str(error.validator))
    if bound:
        return f"{where}: " + bound.format(v=error.validator_value, x=_short(error.instance))
    return f"{where}: {error.message[:300]}"


def errors(name: str, instance: Any) -> list[str]:
    """All violations of schema `name` by `instance`, one line each, in document order."""
    try:
        found = sorted(validator(name).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        return ["(top level): nested too deeply"]
    return [_message(e) for e in found]


#: No file of the kit holds a longer list (the schemas' longest allowed is 10,000): a longer one is refused before
#: the schema looks at every item (a forged record of a million entries would take seconds and a gigabyte).
MAX_LIST_ITEMS = 65_536


def _long_list(instance: Any) -> str | None:
    """The path of the first list longer than MAX_LIST_ITEMS (breadth first, without recursion), or None."""
    todo: list[tuple[str, Any]] = [("", instance)]
    while todo:
        path, x = todo.pop()
        if isinstance(x, list):
            if len(x) > MAX_LIST_ITEMS:
                return path.lstrip(".") or "(top level)"
            todo += [(f"{path}[{i}]", v) for i, v in enumerate(x) if isinstance(v, dict | list)]
        elif isinstance(x, dict):
            todo += [(f"{path}.{k}", v) for k, v in x.items() if isinstance(v, dict | list)]
    return None


def check(name: str, instance: Any, where: str) -> None:
    """Raise KitError naming `where` and the first violation (and how many more) if `instance` is invalid."""
    long = _long_list(instance)
    if long is not None:
        raise KitError(f"{where}: {long}: more than {fm.count(MAX_LIST_ITEMS)} items; no file of the kit holds "
                       "as many")
    found = errors(name, instance)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise KitError(f"{where}: {found[0]}{more}")


def read(name: str, obj: Any, where: str) -> dict[str, Any]:
    """A file's object in the current format: older versions upgraded step by step, then validated; a newer or
    unknown version is one line."""
    if not isinstance(obj, dict):
        raise KitError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    current = FORMAT_VERSIONS[name]
    version = obj.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise KitError(f"{where}: format_version: expected an integer, got {_short(version)}")
    if version > current:
        raise KitError(f"{where}: format_version {version} is newer than this kit reads ({current}); upgrade the kit")
    while version < current:
        step = _UPGRADES.get((name, version))
        if step is None:
            raise KitError(f"{where}: format_version {version} cannot be read by this kit (it writes {current})")
        try:
            obj = step(obj)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise KitError(f"{where}: cannot read format_version {version} ({type(e).__name__}: {e})") from None
        version = obj["format_version"]
    check(name, obj, where)
    return obj
