"""Reading config files and validating them into pydantic models, with errors that name the field.

Owns the two steps every YAML-configured command shares (training configs,
Tune sweeps, the Serve config): read and parse the file, then validate the
document, turning the first pydantic error into a ``ValidationError`` whose
field is the dotted path a person can find in the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticError

from smartsched.model.errors import ValidationError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path, field: str) -> Any:
    """The parsed YAML (or JSON) document at ``path``; errors are named ``field``."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValidationError(field, f"cannot read {path}: {e}") from None
    except yaml.YAMLError as e:
        raise ValidationError(field, f"not valid YAML: {e}", source=str(path)) from None


def validate(model: type[M], doc: Any, *, prefix: str = "", source: str | None = None,
             drop: Sequence[str] = ()) -> M:
    """``model`` from ``doc``; the first error names its field as ``prefix.path.to.field``.

    ``drop``: location parts to leave out of the field name (pydantic adds the
    member type of a union, e.g. ``float`` or ``Range``, to the path).
    """
    try:
        return model.model_validate(doc or {})
    except PydanticError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith(tuple(drop)))
        field = ".".join(p for p in (prefix, loc) if p) or "config"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ValidationError(field, msg, source=source) from None
