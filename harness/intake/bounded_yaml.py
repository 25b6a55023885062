"""YAML that came from elsewhere (a manifest, the manifest text inside a run.json), parsed with bounds so a small
file cannot become a large structure: aliases, nesting and the values once aliases are expanded are counted."""

from __future__ import annotations

import math
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from harness import KitError
from harness import formatter as fm

MAX_YAML_ALIASES = 50
MAX_YAML_DEPTH = 32
#: Values after expanding aliases: a few aliases of aliases make a small file into a huge tree.
MAX_YAML_NODES = 100_000


class ManifestError(KitError):
    """A manifest that cannot be used; the message names file and field."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs and deep nesting before building anything large, a key given twice in
    one mapping (YAML says keys are unique; PyYAML would keep the last silently), and .nan/.inf."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases (*refs); write the values out")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201 - PyYAML's signature
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise ConstructorError(None, None, f"key {key!r} is given twice in this mapping (also line "
                                           f"{seen[key].line + 1}); give each key once", key_node.start_mark)
                seen[key] = key_node.start_mark
            except TypeError:
                pass  # an unhashable key: the base class says so
        return super().construct_mapping(node, deep)

    def construct_yaml_float(self, node):  # noqa: ANN001, ANN201 - PyYAML's signature
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise ConstructorError(None, None, f"{node.value!r} is not a finite number", node.start_mark)
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_yaml_float)


def _check_expanded_size(data: Any, where: str) -> None:
    """Count values as a reader of the data sees them (an alias counts every time it is used), stopping at the
    bound: aliases share one Python object, so the count, not the memory, is what grows."""
    stack, seen = [data], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise ManifestError(f"{where}: invalid YAML: more than {fm.count(MAX_YAML_NODES)} values once aliases are "
                                "expanded; write the values out")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def parse_yaml(text: str, where: str) -> Any:
    """YAML text to plain data, or a one-line ManifestError naming the line."""
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
        _check_expanded_size(data, where)
        return data
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or ["?"])[0]
        raise ManifestError(f"{where}: {at}invalid YAML: {problem}") from None
    except RecursionError:
        raise ManifestError(f"{where}: invalid YAML: nested too deeply") from None
