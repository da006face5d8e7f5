"""Typed errors for bad input.

Owns the exception hierarchy every layer raises for invalid user input, so the
CLI and the service can print one clear line naming the field (and the row of a
trace) instead of a traceback. Must not import anything heavier than stdlib.
"""

from __future__ import annotations

import re


class SmartSchedError(Exception):
    """Base of every error SmartSched raises on purpose (bad input, bad config)."""


class ValidationError(SmartSchedError, ValueError):
    """A value failed validation.

    Attributes:
        field: dotted name of the offending field (``pods.cpu_milli``).
        row: 0-based data row of a trace or list, when the value came from one.
        source: file or object the value came from, when known.
    """

    def __init__(
        self, field: str, message: str, *, row: int | None = None, source: str | None = None
    ) -> None:
        self.field = field
        self.row = row
        self.source = source
        self.message = message
        where = f"{source}: " if source else ""
        at_row = f" (row {row})" if row is not None else ""
        super().__init__(f"{where}{field}{at_row}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild with the same keywords: errors cross process pools and Ray workers.
        return (_rebuild_validation_error,
                (type(self), self.field, self.message, self.row, self.source))


def _rebuild_validation_error(cls: type[ValidationError], field: str, message: str,
                              row: int | None, source: str | None) -> ValidationError:
    return cls(field, message, row=row, source=source)


def remote_cause(e: BaseException) -> BaseException:
    """The exception a remote call raised, unwrapped from Ray's RayTaskError (whose message
    holds the remote traceback and process details); ``e`` itself otherwise."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class UnknownReferenceError(ValidationError):
    """A name (GPU model, preset, region, node, scheduler) that is not defined."""


class PermissionDeniedError(ValidationError):
    """A credential acting outside its scope (a tenant's token naming another tenant)."""


class InfeasibleDecisionError(SmartSchedError):
    """A placement decision that would over-allocate a node or a device.

    The twin refuses such a decision instead of silently corrupting state.
    """


class ServiceUnavailableError(SmartSchedError):
    """The service cannot take decisions now for a reason of its own (not the request's):
    the audit log it must record them in stopped, say. Answered 503."""


# A quoted value in a message: what the client sent (an unknown region, reservation id,
# request id, gang id, GPU model or option name), which an error answer never repeats; a
# quote inside a word (an apostrophe) is not one, nor is one quoted ASCII punctuation
# mark (the JSON parser's "Expecting ',' delimiter"); one quoted letter or digit is (a
# quantity of one Arabic-Indic digit was quoted back: probe round 6).
_QUOTED = re.compile(
    r"""(?<![\w])(?:'(?:[^'\\]|\\.){2,}'|"(?:[^"\\]|\\.){2,}"|''|""|"""
    r"""'[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]'|"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]")"""
    r"""(?![\w])""")


def unechoed(msg: str) -> str:
    """``msg`` with every quoted value in it replaced by ``'...'``: the answer names the
    field (``loc``) and the rule, never the client's input (probe round 5 found unknown
    names, ids and option names quoted back in 404s, 409s and 422s)."""
    return _QUOTED.sub("'...'", msg)
