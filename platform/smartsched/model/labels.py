"""Kubernetes label rules: what a label key and value (a node's labels, a pod's node
selector) may be, checked wherever SmartSched takes them from a client.

Owns the rule the API server applies (a key: an optional DNS subdomain prefix and '/',
then a name of at most 63 characters; a value: the same characters, possibly empty), so
the placement service and the scheduler extender refuse what Kubernetes would. Without
it a selector of 790,000 keys was held by the extender for each pod it saw.
"""

from __future__ import annotations

import re

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
# The most entries one pod's node selector may have here (the API server bounds an
# object's size only; no real selector comes near this).
MAX_SELECTOR_LABELS = 64

KEY_RULE = ("label keys are [prefix/]name: name 1-63 characters of letters, digits, '-', "
            "'_' and '.', starting and ending with a letter or digit; prefix a DNS subdomain")
VALUE_RULE = ("label values are at most 63 characters of letters, digits, '-', '_' and "
              "'.', starting and ending with a letter or digit")


def label_problem(key: str, value: str) -> str | None:
    """Which rule the label ``key: value`` breaks (never quoting it); None if neither."""
    prefix, _, name = key.rpartition("/")
    if (not name or len(name) > 63 or not LABEL_NAME.fullmatch(name)
            or (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)))
            or (not prefix and "/" in key)):
        return KEY_RULE
    if len(value) > 63 or not LABEL_NAME.fullmatch(value):
        return VALUE_RULE
    return None
