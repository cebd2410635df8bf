"""Where a webhook may go: which URLs a task may carry, and which addresses a call may reach.

This module owns two rules, both pure:

- `parse_webhook_url`: is a `webhook_url` one the daemon can call? The enqueue refuses any
  other before its ack (`snerd.core.protocol.validate_enqueue`), and the shell checks again
  before each call, because a log written by an older version or by hand may hold anything.
  It answers with a `WebhookTarget` or a `BadWebhookUrl`; it never raises, whatever it is given.
- `refused_address`: may a call connect to this IP address? The shell resolves the host once,
  asks this for every address, and connects only to an address it allowed (`snerd.io.webhook`).

It must never resolve a name, open a socket or read the settings: `SNERD_WEBHOOK_ALLOW` is the
shell's business, and so is DNS.

Its reasons never quote the URL or the host: they end up in dead letters, which the dashboard
and `stats` show, and a URL may carry a secret in its query. A reason says what is wrong ("port
99999 is out of range") and, for addresses, what kind of address it is ("a loopback address").

The URL rule is stricter than RFC 3986 where leniency only hides a mistake or opens a gap
between this check and the HTTP client's own parser:

- no user name or password (`http://public.example@10.0.0.1/` reads as either host to a
  careless eye; a webhook authenticates with `SNERD_WEBHOOK_SECRET`);
- no whitespace or control characters anywhere (HTTP request splitting, log forging);
- an ASCII host: a DNS name of letters, digits, `-` and `_` (international names in their
  `xn--` form), a dotted-quad IPv4 address, or an IPv6 address in brackets without a zone;
- a name whose last label is a number (`127.1`, `2130706433`, `0x7f.1`) is refused: resolvers
  read those as IPv4 addresses in forms nobody writes on purpose (inet_aton(3));
- a port of 1-65535, and at most `MAX_WEBHOOK_URL_BYTES` in all.

The address rule refuses every range of the IANA special-purpose address registries that is
not globally reachable (RFC 6890 and its updates), multicast, and all IPv6 space outside
2000::/3. IPv6 forms that carry an IPv4 address — IPv4-mapped and -compatible, SIIT, NAT64
64:ff9b::/96 (RFC 6052), 6to4 2002::/16 (RFC 3056) and Teredo 2001::/32 (RFC 4380) — are judged
by the IPv4 address they carry, since that is where the packets end up: `[::7f00:1]` and
`[64:ff9b::7f00:1]` are loopback. (Python's `ipaddress` calls several of them global.) The
local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215) is refused whole: where it carries its IPv4
address depends on a prefix length only the local network knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

__all__ = [
    "MAX_WEBHOOK_URL_BYTES",
    "BadWebhookUrl",
    "WebhookTarget",
    "parse_webhook_url",
    "refused_address",
]

#: The longest `webhook_url` accepted, in UTF-8 bytes. Browsers and proxies commonly stop near
#: 2 KiB; a longer webhook URL is a mistake, and every record of the task carries it.
MAX_WEBHOOK_URL_BYTES = 2048


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookTarget:
    """A `webhook_url` that `parse_webhook_url` accepted."""

    #: "http" or "https".
    scheme: str
    #: The host, lowercase, as the HTTP client sends it: a name (a trailing dot kept), a
    #: dotted-quad IPv4 address, or an IPv6 address without its brackets.
    host: str
    #: The port, explicit or the scheme's default.
    port: int
    #: The host is an IP address, not a name to resolve.
    literal: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class BadWebhookUrl:
    """Why a `webhook_url` was refused."""

    #: A sentence starting with "webhook_url", naming the problem and never quoting the URL.
    reason: str


def parse_webhook_url(url: object) -> WebhookTarget | BadWebhookUrl:
    """The target of `url`, or why it is not a URL a webhook may have. Never raises."""
    if not isinstance(url, str):
        return _bad("must be a string")
    size = len(url.encode("utf-8", "surrogatepass"))
    if size > MAX_WEBHOOK_URL_BYTES:
        return _bad(f"is {size} bytes; the limit is {MAX_WEBHOOK_URL_BYTES}")
    # isprintable() is False for control, format, surrogate, private-use and unassigned
    # characters and every separator but the ASCII space, which isspace() adds.
    if not url.isprintable() or any(c.isspace() for c in url):
        return _bad("must not contain whitespace or control characters")
    scheme_match = _SCHEME.match(url)
    if scheme_match is None:
        return _bad("must be an http:// or https:// URL")
    scheme = scheme_match.group(1).lower()
    if scheme not in _DEFAULT_PORTS:
        return _bad(f"must be an http:// or https:// URL, got scheme '{_cut(scheme)}'")
    rest = url[scheme_match.end() :]
    if not rest.startswith("//"):
        return _bad(f"must be an {scheme}:// URL: '//' and a host after '{scheme}:'")
    authority_match = _AUTHORITY.match(rest, 2)
    assert authority_match is not None  # [^/?#]* matches at any position
    authority = authority_match.group()
    if "@" in authority:
        return _bad(
            "must not carry a user name or password (a webhook authenticates with "
            "SNERD_WEBHOOK_SECRET)"
        )
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return _bad("has a '[' without its ']' around an IPv6 address")
        after = authority[close + 1 :]
        if after and not after.startswith(":"):
            return _bad("has more after the ']' of its IPv6 address than a ':' and a port")
        port_text = after[1:] if after else None
        host_or_bad = _ipv6_host(authority[1:close])
    else:
        if authority.count(":") > 1:
            return _bad("has more than one ':' after its host (an IPv6 address goes in brackets)")
        host_text, colon, port_text_or_empty = authority.partition(":")
        port_text = port_text_or_empty if colon else None
        host_or_bad = _name_or_ipv4_host(host_text)
    if isinstance(host_or_bad, BadWebhookUrl):
        return host_or_bad
    host, literal = host_or_bad
    port = _DEFAULT_PORTS[scheme]
    if port_text:  # absent or empty ("http://h:/"): the scheme's default, as RFC 3986 says
        if not _DIGITS.fullmatch(port_text):
            return _bad(f"port '{_cut(port_text)}' is not a number")
        if len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
            return _bad(f"port {_cut(port_text)} is out of range (1-65535)")
        port = int(port_text)
    return WebhookTarget(scheme=scheme, host=host, port=port, literal=literal)


def refused_address(address: str) -> str | None:
    """What kind of address `address` (an IPv4 or IPv6 address as text, as a resolver gives
    it, a `%zone` allowed) is, when a webhook may not connect to it — "a loopback address" —
    or None when it is a public address. Never raises: text that is not an address is refused.
    """
    try:
        ip = ip_address(address)
    except ValueError:
        return "not an IP address"
    if isinstance(ip, IPv4Address):
        return _ipv4_kind(ip)
    if ip == _V6_UNSPECIFIED:
        return "an unspecified address"  # RFC 4291; connecting to it reaches this host
    if ip == _V6_LOOPBACK:
        return "a loopback address"
    for network, name, carried in _V6_CARRIERS:
        if ip in network:
            kinds = [_ipv4_kind(v4) for v4 in carried(ip)]
            refused = [kind for kind in kinds if kind is not None]
            return f"{name} carrying {refused[0]}" if refused else None
    for network, kind in _V6_KINDS:
        if ip in network:
            return kind
    if ip not in _V6_GLOBAL_UNICAST:
        return "a reserved IPv6 address"
    return None


# ------------------------------------------------------------------ the URL rule's parts


def _bad(detail: str) -> BadWebhookUrl:
    return BadWebhookUrl(reason=f"webhook_url {detail}")


def _cut(text: str) -> str:
    """A piece of a bad URL, short enough to quote: never the host, never more than a port or
    a scheme could be."""
    return text if len(text) <= 20 else text[:20] + "…"


def _ipv6_host(text: str) -> tuple[str, bool] | BadWebhookUrl:
    if "%" in text:
        return _bad("must not give its IPv6 address a zone ('%...')")
    try:
        IPv6Address(text)
    except ValueError:
        return _bad("has an invalid IPv6 address in brackets")
    return text.lower(), True


def _name_or_ipv4_host(text: str) -> tuple[str, bool] | BadWebhookUrl:
    if not text:
        return _bad("has no host")
    if not text.isascii():
        return _bad("must have an ASCII host (write an international name in its xn-- form)")
    host = text.lower()
    name = host[:-1] if host.endswith(".") else host
    for char in name:
        if char not in _NAME_CHARS:
            return _bad(f"has a host with '{char}', which a host name may not contain")
    if len(name) > 253:
        return _bad("has a host name longer than 253 characters")
    labels = name.split(".")
    if any(not label for label in labels):
        return _bad("has a host name with an empty label")
    if any(len(label) > 63 for label in labels):
        return _bad("has a host name with a label longer than 63 characters")
    if _NUMBER_LABEL.fullmatch(labels[-1]):
        # inet_aton(3) reads "127.1", "2130706433" and "0177.0.0.1" as 127.0.0.1; only the
        # plain form is taken (IPv4Address refuses leading zeros and short forms).
        try:
            IPv4Address(host)
        except ValueError:
            return _bad("has a host that ends in a number but is not an IPv4 address a.b.c.d")
        return host, True
    return host, False


_DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")
#: The authority ends at the first '/', '?' or '#' (RFC 3986 §3.2), as the HTTP client reads it.
_AUTHORITY = re.compile(r"[^/?#]*")
_DIGITS = re.compile(r"[0-9]+")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")
#: A label a resolver may read as (part of) an IPv4 address: decimal, or hex with 0x.
_NUMBER_LABEL = re.compile(r"[0-9]+|0x[0-9a-f]*")


# ------------------------------------------------------------------ the address rule's tables

#: IPv4 ranges a webhook may not reach (IANA IPv4 Special-Purpose Address Registry: every entry
#: not globally reachable, the whole of an entry that is only partly so), and multicast.
_V4_KINDS: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(network), kind)
    for network, kind in (
        ("0.0.0.0/8", "a 'this network' address"),  # RFC 791; 0.0.0.0 reaches this host
        ("10.0.0.0/8", "a private address"),  # RFC 1918
        ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),  # RFC 6598
        ("127.0.0.0/8", "a loopback address"),  # RFC 1122
        ("169.254.0.0/16", "a link-local address"),  # RFC 3927; cloud metadata lives here
        ("172.16.0.0/12", "a private address"),  # RFC 1918
        ("192.0.0.0/24", "an IETF protocol assignment address"),  # RFC 6890
        ("192.0.2.0/24", "a documentation address"),  # RFC 5737
        ("192.88.99.0/24", "a 6to4 relay anycast address"),  # RFC 7526: deprecated
        ("192.168.0.0/16", "a private address"),  # RFC 1918
        ("198.18.0.0/15", "a benchmarking address"),  # RFC 2544
        ("198.51.100.0/24", "a documentation address"),  # RFC 5737
        ("203.0.113.0/24", "a documentation address"),  # RFC 5737
        ("224.0.0.0/4", "a multicast address"),  # RFC 5771
        ("240.0.0.0/4", "a reserved address"),  # RFC 1112; 255.255.255.255 is broadcast
    )
)


def _ipv4_kind(ip: IPv4Address) -> str | None:
    for network, kind in _V4_KINDS:
        if ip in network:
            return kind
    return None


def _low32(ip: IPv6Address) -> list[IPv4Address]:
    return [IPv4Address(int(ip) & 0xFFFFFFFF)]


def _sixtofour(ip: IPv6Address) -> list[IPv4Address]:
    return [IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)]


def _teredo(ip: IPv6Address) -> list[IPv4Address]:
    # RFC 4380 §4: the server's address in bits 32-63, the client's, inverted, in the last 32.
    value = int(ip)
    return [IPv4Address((value >> 64) & 0xFFFFFFFF), IPv4Address(~value & 0xFFFFFFFF)]


_V6_UNSPECIFIED = IPv6Address("::")
_V6_LOOPBACK = IPv6Address("::1")
#: IPv6 forms that carry an IPv4 address, judged by what they carry (checked after :: and ::1,
#: which lie in ::/96, and before `_V6_KINDS`, which holds the wider 2001::/23 around Teredo).
_V6_CARRIERS: tuple[tuple[IPv6Network, str, Callable[[IPv6Address], list[IPv4Address]]], ...] = (
    (IPv6Network("::ffff:0:0/96"), "an IPv4-mapped address", _low32),  # RFC 4291
    (IPv6Network("::/96"), "an IPv4-compatible address", _low32),  # RFC 4291: deprecated
    (IPv6Network("::ffff:0:0:0/96"), "an IPv4-translated address", _low32),  # RFC 2765
    (IPv6Network("64:ff9b::/96"), "a NAT64 address", _low32),  # RFC 6052
    (IPv6Network("2002::/16"), "a 6to4 address", _sixtofour),  # RFC 3056
    (IPv6Network("2001::/32"), "a Teredo address", _teredo),  # RFC 4380
)

#: IPv6 ranges a webhook may not reach (IANA IPv6 Special-Purpose Address Registry, as for
#: IPv4), in order: the first that holds an address names it.
_V6_KINDS: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(network), kind)
    for network, kind in (
        ("64:ff9b:1::/48", "a local-use NAT64 address"),  # RFC 8215
        ("100::/64", "a discard-only address"),  # RFC 6666
        ("2001::/23", "an IETF protocol assignment address"),  # RFC 2928
        ("2001:db8::/32", "a documentation address"),  # RFC 3849
        ("3fff::/20", "a documentation address"),  # RFC 9637
        ("5f00::/16", "a segment routing (SRv6) address"),  # RFC 9602
        ("fc00::/7", "a unique local (private) address"),  # RFC 4193
        ("fe80::/10", "a link-local address"),  # RFC 4291
        ("fec0::/10", "a site-local address"),  # RFC 3879: deprecated
        ("ff00::/8", "a multicast address"),  # RFC 4291
    )
)
#: All IPv6 unicast space IANA has ever allocated for global use (RFC 4291 §2.4); the rest is
#: reserved.
_V6_GLOBAL_UNICAST = IPv6Network("2000::/3")
