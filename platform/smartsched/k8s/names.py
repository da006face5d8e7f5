"""Kubernetes object names: what the API server accepts, checked before a name is used.

Owns the DNS-1123 rules (a label: a namespace; a subdomain: most object names, a Node's
and a Lease's) and the lease holder's identity. The command line checks the names it puts
into API paths; the snapshot skips a Node whose name the API server could not hold (a
hand-made or merged list file sent to the extender), as it skips any node it cannot read.
"""

from __future__ import annotations

import re

from smartsched.model.errors import ValidationError

# DNS-1123: a label (a namespace) is at most 63 lowercase alphanumerics or '-', starting and
# ending alphanumeric; a subdomain (most object names, a Lease's) is dot-separated labels,
# at most 253 characters.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
# A Lease's holderIdentity is free text to the API; a hostname (any case) or client-go's
# ``<hostname>_<uuid>`` must pass, blanks and control characters (and empty: a holder
# nobody can tell from "no holder") must not.
_IDENTITY = r"[A-Za-z0-9]([-A-Za-z0-9._:]*[A-Za-z0-9])?"
NAME_KINDS = {"label": (_DNS1123_LABEL, 63,
                        "lowercase letters, digits and '-', starting and ending with a "
                        "letter or digit"),
              "subdomain": (_DNS1123_SUBDOMAIN, 253,
                            "lowercase letters, digits, '-' and '.', starting and ending "
                            "with a letter or digit"),
              "identity": (_IDENTITY, 253,
                           "letters, digits, '-', '_', '.' and ':', starting and ending "
                           "with a letter or digit")}


def name_problem(value: str, kind: str) -> str | None:
    """Why ``value`` is not a Kubernetes name of ``kind`` (``label``: a namespace;
    ``subdomain``: an object's name, a Node's; ``identity``: a lease holder), never quoting
    it; None when it is one."""
    pattern, most, rule = NAME_KINDS[kind]
    if not value:
        return "must not be empty"
    if len(value) > most:
        return f"at most {most} characters, got {len(value)}"
    if not re.fullmatch(pattern, value):
        return f"not a Kubernetes name: use {rule}"
    return None


def check_name(field: str, value: str, kind: str) -> str:
    """``value`` when it is a Kubernetes name of ``kind`` (``name_problem``), else a
    ``ValidationError`` naming ``field``. The names go into API paths: an empty scheduler
    name made the Lease's URL the whole collection's."""
    why = name_problem(value, kind)
    if why is not None:
        raise ValidationError(field, f"{value!r} is {why}" if why.startswith("not a")
                              else why)
    return value
