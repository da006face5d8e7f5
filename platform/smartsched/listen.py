"""Where a service may listen: a host checked before anything starts.

Owns the one check every listening command (``serve``, ``k8s extender``, ``telemetry
serve``) and the service's config file (``http_options.host``) apply to a host: it is
not empty (the socket layer reads ``''`` as every interface, so a service meant for
loopback was reachable from the network), it resolves, and this machine can bind it.
Without it uvicorn and Serve exited with the resolver's or the socket's bare errno, the
extender with status 0.
"""

from __future__ import annotations

import socket

from smartsched.model.errors import ValidationError


def check_listen_host(value: object, field: str) -> str:
    """``value`` if a service can listen there, else a ValidationError naming ``field``.
    Binds a throw-away socket to port 0 of the host's first address (nothing listens;
    the port is the kernel's pick), so an address of another machine is refused too."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field, "is empty (give a host name or address; 0.0.0.0 "
                              "listens on every interface)")
    shown = repr(value[:200])
    if value.startswith("[") and value.endswith("]"):
        raise ValidationError(field, f"{shown}: give an IPv6 address without brackets")
    try:
        infos = socket.getaddrinfo(value, None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except UnicodeError:
        raise ValidationError(field, f"{shown} is not a valid host name") from None
    except socket.gaierror as e:
        if e.errno == socket.EAI_AGAIN:
            raise ValidationError(field, f"{shown} could not be resolved now (temporary "
                                  "name-resolution failure; give an address)") from None
        raise ValidationError(field, f"{shown} does not resolve to an address "
                              f"({e.strerror})") from None
    except OSError as e:
        raise ValidationError(field, f"{shown} does not resolve to an address "
                              f"({e.strerror or e})") from None
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr[0], 0, *addr[2:]))
    except OSError as e:
        raise ValidationError(field, f"{shown} is not an address this machine can listen "
                              f"on ({e.strerror or e})") from None
    return value
