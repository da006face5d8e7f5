"""Reading config files and validating them into pydantic models, with errors that name the field.

Owns the two steps every YAML-configured input shares (training configs, Tune
sweeps, the Serve config, scheduler and scenario profiles, workload profiles):
read and parse the file (or a resource packaged with SmartSched), then
validate the document, turning the first pydantic error into a
``ValidationError`` whose field is the path a person can find in the file
(``sweep.objectives.a.mode``, ``mine.filters[0].name``).

``model/`` reads its cluster files itself: ``model`` sits below this module
(``ValidationError`` lives there), so it cannot import it back.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticError

from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path, field: str, *, kind: str = "YAML",
              cite_source: bool = True) -> Any:
    """The parsed YAML (or JSON) document at ``path``; errors are named ``field``.

    ``kind`` names the format in the error ("JSON/YAML" where both are expected);
    ``cite_source`` adds the path to the error (off where the field already says which
    file, as a command's ``--nodes`` does).
    """
    path = Path(path)
    try:
        text = read_regular_file(path, MAX_YAML_BYTES).decode("utf-8")
    except OSError as e:
        raise ValidationError(field, f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:  # a binary file, or another encoding
        raise ValidationError(field, f"{path} is not UTF-8 text: {e.reason} at byte "
                              f"{e.start}") from None
    return read_yaml_text(text, field, source=str(path) if cite_source else None, kind=kind)


def read_config(path: str | Path, field: str) -> Any:
    """A command's ``--config`` file (``read_yaml``), which may not be empty: a zero-byte
    file (a failed copy, a ``>`` slip) was read as every default and started an hour of
    training; leaving the option out is how to ask for the defaults."""
    doc = read_yaml(path, field)
    if doc is None:
        raise ValidationError(field, "the file is empty (no setting in it): leave the "
                              "option out for every default", source=str(path))
    return doc


# What one document may hold once its aliases are expanded, and how deep it may nest: a
# few lines of aliases of aliases ("billion laughs") stand for ~10^9 values, which
# validating, copying or printing the document would expand for real; no config is
# anywhere near either bound.
MAX_YAML_VALUES = 1_000_000
MAX_YAML_DEPTH = 100
MAX_YAML_BYTES = 256 << 20  # a config (or a cluster's node list) file


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a mapping that gives one key twice (safe_load
    keeps the last silently: a second ``nodes:`` would drop the first's nodes). Keys
    brought in by a merge (``<<: *base``) may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                        key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.2 reads ``1e300`` and ``2E-3`` as numbers; PyYAML (YAML 1.1) wants a dot in the
# mantissa and read them as text, which a numeric field then refused as "must be a number,
# got '1e300'". This loader reads them as YAML 1.2 does.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


_NOT_JSON = object()


def _as_json(text: str) -> Any:
    """``text`` parsed as JSON when it is JSON (YAML's subset, as `kubectl get -o json`
    writes a node list), ``_NOT_JSON`` otherwise: Python's JSON reader takes 0.1 s where
    YAML's constructor takes 30 s for 10 MB. The same rules as the YAML path: a key twice
    is refused and NaN and Infinity are not numbers (both by sending the text to the
    YAML path, which names them), and anything else the JSON reader refuses goes there
    too."""
    if text.lstrip()[:1] not in ("{", "["):
        return _NOT_JSON

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) != len(items):  # the YAML path names the key and its line
            raise ValueError("duplicate key")
        return out

    def not_a_number(name: str) -> Any:
        raise ValueError(name)

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=not_a_number)
    except (ValueError, RecursionError):
        return _NOT_JSON


def read_yaml_text(text: str, field: str, source: str | None = None, *,
                   kind: str = "YAML") -> Any:
    """The parsed YAML document in ``text`` (read from ``source``); errors are named ``field``
    and fit on one line."""
    doc = _as_json(text)
    try:
        if doc is _NOT_JSON:
            doc = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no tag runs code
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        what = "; ".join(str(x) for x in (e.context, e.problem) if x)
        raise ValidationError(field, f"not valid {kind}: {what}{where}", source=source) from None
    except yaml.YAMLError as e:
        raise ValidationError(field, f"not valid {kind}: {e}", source=source) from None
    except RecursionError:
        raise ValidationError(field, f"not valid {kind}: nested deeper than "
                              f"{MAX_YAML_DEPTH} levels", source=source) from None
    except ValueError as e:  # Python's cap on a number's digits (4,300), met in the loader
        what = ("a number of more than 4,300 digits" if "digits" in str(e)
                else str(e)[:120])
        raise ValidationError(field, f"not valid {kind}: {what}", source=source) from None
    # Each value written out takes a character at least: only aliases make more.
    _check_size(doc, max(MAX_YAML_VALUES, len(text)), field, source)
    return doc


def _check_size(doc: Any, limit: int, field: str, source: str | None) -> None:
    """Refuse a document of more than ``limit`` values (aliases counted at each use) or
    nested deeper than MAX_YAML_DEPTH (a document that contains itself is both)."""
    stack = [(doc, 0)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > limit:
            raise ValidationError(field, f"document expands to more than {limit:,} "
                                  "values (aliases of aliases?)", source=source)
        if depth > MAX_YAML_DEPTH:
            raise ValidationError(field, f"document nests deeper than {MAX_YAML_DEPTH} "
                                  "levels", source=source)
        if isinstance(value, dict):
            stack.extend((x, depth + 1) for kv in value.items() for x in kv)
        elif isinstance(value, list):
            stack.extend((x, depth + 1) for x in value)


MAX_TOKEN_BYTES = 64 << 10  # a bearer token file: a line of a few dozen characters


def read_token_file(path: str | Path, field: str) -> str:
    """The bearer token in the file at ``path`` (surrounding whitespace dropped); errors
    are named ``field``. A FIFO or a directory is refused rather than waited on, a binary
    file is named rather than a UnicodeDecodeError traceback, and an empty file is an
    error: a file named for a token that holds none is a mistake, not "no token"."""
    try:
        token = read_regular_file(path, MAX_TOKEN_BYTES).decode("utf-8").strip()
    except OSError as e:
        raise ValidationError(field, f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValidationError(field, f"{path} is not UTF-8 text: {e.reason} at byte "
                              f"{e.start}") from None
    if not token:
        raise ValidationError(field, f"{path} holds no token")
    return check_token(token, field, f"{path}")


def check_token(token: str, field: str, source: str = "the token") -> str:
    """``token`` when it can travel in an Authorization header: printable ASCII without
    blanks (RFC 6750's token characters and more), else a ValidationError naming
    ``field`` and ``source`` (never the token). A token of other characters was a
    UnicodeEncodeError traceback in the client, and one of two lines an
    ``InvalidHeader``."""
    if "\n" in token or "\r" in token:
        raise ValidationError(field, f"{source} holds more than one line: a token is one")
    if not all("!" <= ch <= "~" for ch in token):
        raise ValidationError(field, f"{source}: a token is printable ASCII without blanks")
    return token


def read_resource(package: str, name: str, field: str) -> Any:
    """The parsed YAML file ``name`` packaged in ``package`` (``importlib.resources``).

    Parsed once per process and handed out as a deep copy (callers may change what they
    get): an env builds a workload from the packaged profile at every episode reset, and
    parsing it again cost more than the episode's first hundred steps."""
    return copy.deepcopy(_parsed_resource(package, name, field))


@functools.lru_cache(maxsize=64)
def _parsed_resource(package: str, name: str, field: str) -> Any:
    text = resources.files(package).joinpath(name).read_text()
    return read_yaml_text(text, field, source=f"{package}:{name}")


def field_path(loc: Sequence[str | int], drop: Sequence[str] = ()) -> str:
    """``filters[0].name`` from a pydantic location ``("filters", 0, "name")``.

    ``drop``: location parts to leave out (see :func:`validate`).
    """
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(tuple(drop)):
            out += f".{part}" if out else str(part)
    return out


def first_error(e: PydanticError, prefix: str = "", drop: Sequence[str] = ()) -> tuple[str, str]:
    """(field, message) of the first error of ``e``, the field as ``prefix.path.to.field``."""
    err = e.errors()[0]
    loc = field_path(err["loc"], drop)
    sep = "" if loc.startswith("[") else "."
    field = sep.join(p for p in (prefix, loc) if p) or "config"
    given = err.get("input")
    if isinstance(given, float) and not math.isfinite(given):  # (NaN was blamed on a bound)
        return field, f"must be a finite number, got {given}"
    return field, str(err["msg"]).removeprefix("Value error, ")


def validate(model: type[M], doc: Any, *, prefix: str = "", source: str | None = None,
             drop: Sequence[str] = ()) -> M:
    """``model`` from ``doc``; the first error names its field as ``prefix.path.to.field``.

    ``drop``: location parts to leave out of the field name (pydantic adds the
    member type of a union, e.g. ``float`` or ``Range``, to the path).
    """
    try:  # an empty file (None) is every default; [], '' or 0 is no mapping at all
        out = model.model_validate({} if doc is None else doc)
    except PydanticError as e:
        field, msg = first_error(e, prefix, drop)
        raise ValidationError(field, msg, source=source) from None
    refuse_bools_as_numbers(out, doc, prefix, source)
    return out


def refuse_bools_as_numbers(parsed: Any, raw: Any, prefix: str = "",
                            source: str | None = None) -> None:
    """ValidationError naming the first ``true``/``false`` that validation took as a number
    (pydantic reads true as 1 for a number field: ``failure_toleration_s: true`` was one
    second, ``load: true`` a load of 1). ``parsed``: what ``raw`` validated into."""
    where = _bool_as_number(parsed, raw)
    if where is not None:
        path = "".join(where).lstrip(".")
        sep = "." if prefix and path and not path.startswith("[") else ""
        raise ValidationError(f"{prefix}{sep}{path}" or "config",
                              "must be a number, got a true/false value", source=source)


def _bool_as_number(parsed: Any, raw: Any) -> list[str] | None:
    """The path (``["a", ".b", "[2]"]``) to a bool in ``raw`` that is not a bool in
    ``parsed``, or None."""
    if isinstance(raw, bool):
        return [] if not isinstance(parsed, bool) else None
    pairs: list[tuple[str, Any, Any]] = []
    if isinstance(parsed, BaseModel) and isinstance(raw, dict):
        for name, info in type(parsed).model_fields.items():
            key = info.alias or name
            if key in raw:
                pairs.append((f".{key}", getattr(parsed, name), raw[key]))
    elif isinstance(parsed, dict) and isinstance(raw, dict):
        pairs = [(f".{k}", parsed[k], v) for k, v in raw.items() if k in parsed]
    elif isinstance(parsed, list | tuple) and isinstance(raw, list | tuple) and len(
            parsed) == len(raw):
        pairs = [(f"[{i}]", p, r) for i, (p, r) in enumerate(zip(parsed, raw, strict=True))]
    for step, p, r in pairs:
        below = _bool_as_number(p, r)
        if below is not None:
            return [step, *below]
    return None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, mappings recursively (neither is modified)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(
            out.get(k), dict) else v
    return out
