"""Where an alert may not go: every spelling of a host, read the way this machine's resolver reads it.

A channel's host reaches the C resolver as written, and it reads much more than a dotted quad as
an IPv4 address: ``2852039166`` (one 32-bit number), ``0xA9FEA9FE``, ``0xa9.0xfe.0xa9.0xfe``,
``0251.0376.0251.0376`` (octal), ``169.254.43518`` (the last part fills the bytes left) are all
169.254.169.254, and an IPv6 literal can carry an IPv4 address (``[::ffff:169.254.169.254]``).
:func:`literal_address` reads every one of them (as ``inet_aton`` and :mod:`ipaddress` do), so
that :func:`host_problem` can refuse a cloud metadata endpoint, a link-local address or the
unspecified address (which reaches this machine) however it is written, when a channel is added
and again when it is sent. A host name is refused by name when it is a metadata service's
(:data:`METADATA_NAMES`); what a name resolves to is checked at each send (``channels.resolve``).

A host named with ``--allow HOST`` (exactly as it is written in the URL) is not refused.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata services (AWS, GCP, Azure, OpenStack: 169.254.169.254; AWS IPv6; ECS; Alibaba).
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200"))
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata", "instance-data"})
# IPv6 prefixes whose last 32 bits are an IPv4 address a packet may end up at: IPv4-translated
# (::ffff:0:0:0/96) and the NAT64 well-known prefix (64:ff9b::/96). IPv4-mapped and 6to4 addresses
# are read by ipaddress itself; IPv4-compatible ones (::a.b.c.d) below.
_EMBEDDING = (ipaddress.IPv6Network("::ffff:0:0:0/96"), ipaddress.IPv6Network("64:ff9b::/96"))
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def _ipv4_part(text: str) -> int | None:
    """One part of an IPv4 literal as ``inet_aton`` reads it: ``0x`` hexadecimal, a leading 0
    octal, else decimal; None for anything else."""
    if not _IPV4_PART.fullmatch(text):
        return None
    if text[:2] in ("0x", "0X"):
        return int(text[2:] or "0", 16)
    if text.startswith("0"):
        return int(text, 8)
    return int(text)


def ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as an IPv4 address in any spelling the C resolver takes (one to four parts, each
    decimal, octal or hexadecimal, the last filling the bytes left), or None when it is not one."""
    text = host[:-1] if host.endswith(".") else host  # a trailing dot ends a name, and Apprise drops it
    parts = text.split(".")
    if 1 <= len(parts) <= 4:
        numbers = [_ipv4_part(p) for p in parts]
        if all(n is not None for n in numbers):
            *head, last = [int(n or 0) for n in numbers]
            if all(n <= 255 for n in head) and last < 256 ** (5 - len(parts)):
                value = sum(n << (8 * (3 - i)) for i, n in enumerate(head)) + last
                return ipaddress.IPv4Address(value)
    try:  # the resolver's own reading is the last word (glibc's inet_aton takes "1.2.3.4 anything")
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` is when it is an IP literal in any spelling (IPv6 with or without its
    brackets and zone, IPv4 as :func:`ipv4_literal` reads it), else None (a name, or a token
    that sits in the host's place)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text.split("%", 1)[0])
        except ValueError:
            return None
    return ipv4_literal(text)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, translated, NAT64, 6to4)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    value = int(ip)
    if 1 < value < 2**32 or any(ip in net for net in _EMBEDDING):  # ::a.b.c.d, ::ffff:0:a.b.c.d, 64:ff9b::a.b.c.d
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


def refused(address: str | IPAddress) -> str | None:
    """Why an alert may not be sent to ``address`` (an IP address, a zone allowed after ``%``),
    or None: a cloud metadata address, a link-local address, the unspecified address; an IPv6
    address is judged by the IPv4 address it carries too."""
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    candidates: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
        candidates.append(inner)
    for candidate in candidates:
        if candidate in METADATA:
            return "a cloud metadata address"
        if candidate.is_link_local:
            return "a link-local address"
        if candidate.is_unspecified:
            return "the unspecified address (it reaches this machine)"
    return None


def bare(host: str) -> str:
    """``host`` lower-case, without IPv6 brackets or a trailing dot: how a name is compared."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return text[:-1] if text.endswith(".") else text


def allowed(host: str, allow: Iterable[str]) -> bool:
    """Whether ``--allow`` names ``host``."""
    return bare(host) in {bare(a) for a in allow}


def host_problem(host: str, allow: Iterable[str] = ()) -> str | None:
    """Why a channel may not reach ``host``, judged without a lookup, or None: a metadata
    service's name, or a literal address (in any spelling) that :func:`refused` refuses. The
    sentence names the host, the address it is, and ``--allow``."""
    if not host or allowed(host, allow):
        return None
    hint = f"refused (allow it by name with --allow {host})"
    if bare(host) in METADATA_NAMES:
        return f"{host} is a cloud metadata name; {hint}"
    address = literal_address(host)
    if address is None:
        return None
    why = refused(address)
    if why is None:
        return None
    inner = _embedded_ipv4(address) if isinstance(address, ipaddress.IPv6Address) else None
    shown = f"{address} ({inner})" if inner is not None else str(address)
    spelled = "" if bare(host) == shown else f"{shown}, "
    return f"{host} is {spelled}{why}; {hint}"


def plugin_hosts(plugin: Any) -> list[str]:
    """The hosts an Apprise service object will connect to, as far as it says: its ``host`` and
    every ``..._host`` it holds (an email channel's ``smtp_host``, from ``?smtp=``)."""
    found = [str(v) for k, v in vars(plugin).items() if (k == "host" or k.endswith("_host")) and isinstance(v, str)]
    return [h for h in found if h]
