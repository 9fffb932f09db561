"""Reading the JSON and YAML documents distmis is given, as untrusted input.

``dataset.json`` is often written by hand or shared between groups; ``info.json`` and
``preprocessing.json`` travel with datasets and models. Plain ``json.loads`` / ``yaml.safe_load``
let a duplicated key silently win (a second ``train:`` section replaced the first), raise
``RecursionError`` on deeply nested input, expand YAML alias bombs into gigabytes, and
leave type mistakes to a ``KeyError`` deep inside training. Here every document is read
strictly and checked against a pydantic model, and every problem becomes one error naming
the file, the field and what was expected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from distmis.exceptions import DistmisError
from distmis.links import read_regular_text

M = TypeVar("M", bound=BaseModel)

#: the most nodes a YAML document may expand to (aliases counted at every use): far above any
#: real search-space file (a few hundred), far below an alias bomb (a billion)
MAX_YAML_NODES = 100_000
#: deepest nesting accepted in JSON documents (real ones are 3-4 levels deep)
MAX_JSON_DEPTH = 64


class DuplicateKeyError(ValueError):
    """A mapping repeats a key (raised while parsing; turned into the caller's error class)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, without recursion (stops past ``limit``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def read_json(path: str | Path, *, error: type[DistmisError], what: str = "JSON") -> Any:
    """Parse a JSON file strictly: UTF-8, no duplicate keys, nesting at most :data:`MAX_JSON_DEPTH`.

    Raises:
        error: naming the file and the problem.
    """
    path = Path(path)
    try:
        text = read_regular_text(path, follow_links=True)
    except FileNotFoundError:
        raise error(f"{path}: missing") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except DuplicateKeyError as exc:
        raise error(
            f"{path}: {exc}: each key may appear once (a repeated key would silently replace the first)"
        ) from None
    except RecursionError:
        raise error(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep; expected {what}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON: {exc}") from None
    if _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise error(f"{path}: nested more than {MAX_JSON_DEPTH} levels deep; expected {what}")
    return data


def finite_or_none(value: Any) -> float | None:
    """A number read from a record (CSV cell, tag, JSON value), or ``None`` where it is missing,
    not a number, NaN or infinite: a reader of results skips such a value rather than failing."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def validation_problems(exc: ValidationError) -> list[tuple[tuple[Any, ...], str]]:
    """Each problem of a pydantic error as (field path, what was expected and what was given).

    One rule for every document distmis reads, so that a configuration, a manifest and a model
    record word the same mistake the same way. A union (a value or a list of values) fails once
    per branch; only the deepest, most precise of those is kept.
    """
    problems: list[tuple[tuple[Any, ...], str]] = []
    for err in exc.errors():
        # pydantic inserts union members ('tuple[int, int, int]') and validator kinds into locations
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required, but missing"
        elif "input" in err and not isinstance(err["input"], dict):
            shown = repr(err["input"])
            msg = f"{msg} (got {shown[:80]}{'...' if len(shown) > 80 else ''})"
        problems.append((loc, msg))
    locs = [loc for loc, _ in problems]
    deepest = [(loc, m) for loc, m in problems if not any(o[: len(loc)] == loc and len(o) > len(loc) for o in locs)]
    return [(loc, m) for i, (loc, m) in enumerate(deepest) if loc not in [q for q, _ in deepest[:i]]]


def format_field(loc: tuple[Any, ...]) -> str:
    """A field path as a user writes it: ``train.patch.0``; the whole document is ``<top level>``."""
    return ".".join(str(p) for p in loc) or "<top level>"


def describe_validation_error(exc: ValidationError) -> str:
    """``field.path: what was expected (got X)`` for the first problem, plus how many more."""
    problems = validation_problems(exc)
    loc, msg = problems[0]
    text = f"{format_field(loc)}: {msg}"
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return text


def validate_document(model: type[M], data: Any, path: str | Path, *, error: type[DistmisError]) -> M:
    """``model.model_validate(data)``, with a validation error turned into one line naming the file."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: {describe_validation_error(exc)}") from None


def load_json_document(model: type[M], path: str | Path, *, error: type[DistmisError], what: str) -> M:
    """Read ``path`` strictly and validate it against ``model``."""
    return validate_document(model, read_json(path, error=error, what=what), path, error=error)


# --------------------------------------------------------------------------- YAML
class StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (the last one would silently win otherwise).

    Merge keys (``<<: *defaults``) work as YAML defines them: the merged mapping's keys come
    first and the mapping's own keys override them; only a key written twice in the mapping
    itself is refused.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a plain value, got {type(key).__name__}", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {seen[key]}); each key may appear once, "
                    "a repeated key would silently replace the first",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        self.flatten_mapping(node)  # merge keys: their mappings first, this mapping's own keys after (they win)
        merged: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            merged[self.construct_object(key_node, deep=deep)] = self.construct_object(value_node, deep=deep)
        return merged


StrictYamlLoader.add_constructor("tag:yaml.org,2002:map", StrictYamlLoader.construct_yaml_map)


def expanded_size(node: yaml.Node | None, limit: int = MAX_YAML_NODES) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (stops counting past ``limit``).

    A composed YAML graph shares aliased nodes, so a "billion laughs" file is small until
    something walks it; this counts the walk with memoisation instead of doing it.
    """
    if node is None:
        return 0
    memo: dict[int, int] = {}
    order: list[yaml.Node] = []
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:  # iterative post-order: deep documents must not hit the recursion limit
        item, children_done = stack.pop()
        if id(item) in memo:
            continue
        children = _children(item)
        if children_done or not children:
            size = 1 + sum(memo.get(id(c), 0) for c in children)
            memo[id(item)] = min(size, limit + 1)
            order.append(item)
            continue
        stack.append((item, True))
        stack.extend((c, False) for c in children if id(c) not in memo)
    return memo[id(node)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_YAML_NODES",
    "StrictYamlLoader",
    "describe_validation_error",
    "expanded_size",
    "load_json_document",
    "read_json",
    "validate_document",
]
