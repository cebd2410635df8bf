"""snerd.core.webhook_target: which webhook URLs are taken, and which addresses a call may reach."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.webhook_target import (
    MAX_WEBHOOK_URL_BYTES,
    BadWebhookUrl,
    WebhookTarget,
    parse_webhook_url,
    refused_address,
)


@pytest.mark.parametrize(
    ("url", "scheme", "host", "port", "literal"),
    [
        ("http://example.com/hook", "http", "example.com", 80, False),
        ("https://example.com/hook", "https", "example.com", 443, False),
        ("HTTPS://Hooks.Example.COM./p?q=1#f", "https", "hooks.example.com.", 443, False),
        ("http://example.com:8080", "http", "example.com", 8080, False),
        ("http://example.com:/x", "http", "example.com", 80, False),  # RFC 3986: empty = default
        ("http://example.com?x=1", "http", "example.com", 80, False),
        ("http://a_b-c.example/é?ü", "http", "a_b-c.example", 80, False),
        ("http://xn--nxasmq6b.example/", "http", "xn--nxasmq6b.example", 80, False),
        ("http://93.184.215.14:65535/", "http", "93.184.215.14", 65535, True),
        ("http://[2606:4700::1111]:8443/x", "http", "2606:4700::1111", 8443, True),
        ("http://[::FFFF:8.8.8.8]/", "http", "::ffff:8.8.8.8", 80, True),
    ],
)
def test_urls_a_webhook_may_have(
    url: str, scheme: str, host: str, port: int, literal: bool
) -> None:
    assert parse_webhook_url(url) == WebhookTarget(
        scheme=scheme, host=host, port=port, literal=literal
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # The poison pills of the issue: each was acked, then crashed every daemon that ran it.
        ("http://127.0.0.1:99999/x", "port 99999 is out of range (1-65535)"),
        ("http://h:abc/x", "port 'abc' is not a number"),
        ("http://[::1/x", "has a '[' without its ']' around an IPv6 address"),
        ("http://h:0/", "port 0 is out of range (1-65535)"),
        ("http://h:000080/", "port 000080 is out of range (1-65535)"),
        ("http://h:-1/", "port '-1' is not a number"),
        ("http://h:٨٠/", "port '٨٠' is not a number"),  # Arabic-Indic digits: not a port
        ("ftp://example.com/x", "must be an http:// or https:// URL, got scheme 'ftp'"),
        ("example.com/x", "must be an http:// or https:// URL"),
        ("http:example.com", "must be an http:// URL: '//' and a host after 'http:'"),
        ("http://", "has no host"),
        ("http:///x", "has no host"),
        ("http://:80/", "has no host"),
        ("http://user:pw@example.com/", "must not carry a user name or password"),
        ("http://public.example@10.0.0.1/", "must not carry a user name or password"),
        ("http://exa mple.com/", "must not contain whitespace or control characters"),
        ("http://example.com/\r\nX-Injected: 1", "must not contain whitespace or control"),
        ("http://example.com/\x00", "must not contain whitespace or control characters"),
        ("http://example.com/\u200b", "must not contain whitespace or control characters"),
        ("http://example.com/\ud800", "must not contain whitespace or control characters"),
        ("http://bücher.example/", "must have an ASCII host (write an international name in"),
        ("http://a..b/", "has a host name with an empty label"),
        ("http://.", "has a host name with an empty label"),
        ("http://" + "a" * 64 + ".example/", "has a host name with a label longer than 63"),
        ("http://" + "a." * 127 + "example/", "has a host name longer than 253 characters"),
        ("http://exam%70le.com/", "has a host with '%', which a host name may not contain"),
        ("http://a\\b.example/", "has a host with '\\', which a host name may not contain"),
        ("http://a:b:c/", "has more than one ':' after its host (an IPv6 address goes in"),
        ("http://::1/", "has more than one ':' after its host"),
        ("http://[::1]x/", "has more after the ']' of its IPv6 address than a ':' and a port"),
        ("http://[::1]:99999/", "port 99999 is out of range"),
        ("http://[fe80::1%25eth0]/", "must not give its IPv6 address a zone ('%...')"),
        ("http://[::1::2]/", "has an invalid IPv6 address in brackets"),
        ("http://[v1.x]/", "has an invalid IPv6 address in brackets"),
        # Numbers a resolver reads as IPv4 addresses (inet_aton(3)): all are 127.0.0.1.
        ("http://2130706433/", "has a host that ends in a number but is not an IPv4 address"),
        ("http://127.1/", "has a host that ends in a number but is not an IPv4 address"),
        ("http://0x7f.0.0.1/", "has a host that ends in a number but is not an IPv4 address"),
        ("http://0177.0.0.1/", "has a host that ends in a number but is not an IPv4 address"),
        ("http://127.0.0.1./", "has a host that ends in a number but is not an IPv4 address"),
        ("http://256.0.0.1/", "has a host that ends in a number but is not an IPv4 address"),
        (
            "http://h/" + "x" * MAX_WEBHOOK_URL_BYTES,
            f"is 2057 bytes; the limit is {MAX_WEBHOOK_URL_BYTES}",
        ),
        ("http://h/" + "é" * 1100, f"is 2209 bytes; the limit is {MAX_WEBHOOK_URL_BYTES}"),
    ],
)
def test_urls_refused_say_what_is_wrong(url: str, reason: str) -> None:
    result = parse_webhook_url(url)
    assert isinstance(result, BadWebhookUrl), result
    assert result.reason.startswith(f"webhook_url {reason}"), result.reason


def test_a_url_at_the_limit_is_taken() -> None:
    url = "http://h/" + "x" * (MAX_WEBHOOK_URL_BYTES - len("http://h/"))
    assert isinstance(parse_webhook_url(url), WebhookTarget)
    assert isinstance(parse_webhook_url(url + "x"), BadWebhookUrl)


@pytest.mark.parametrize("value", [None, 7, 1.5, ["http://h/"], {"url": "http://h/"}, b"http://h/"])
def test_a_url_that_is_not_a_string_is_refused(value: object) -> None:
    # A record written by hand or by an older version may hold any JSON value.
    assert parse_webhook_url(value) == BadWebhookUrl(reason="webhook_url must be a string")


def test_reasons_never_quote_the_host_or_the_url() -> None:
    for url in [
        "http://secret-host.example:99999/x?token=abc",
        "http://secret-host.example:abc/x",
        "http://user@secret-host.example/",
        "http://secret-host..example/",
        "http://secret-host.example/ x",
    ]:
        result = parse_webhook_url(url)
        assert isinstance(result, BadWebhookUrl)
        assert "secret-host" not in result.reason and "token" not in result.reason


# ------------------------------------------------------------------ the address rule


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.255.0.9", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.31.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("169.254.169.254", "a link-local address"),  # cloud metadata
        ("100.64.0.1", "a shared (carrier-grade NAT) address"),
        ("0.0.0.0", "a 'this network' address"),
        ("192.0.2.7", "a documentation address"),
        ("198.18.0.1", "a benchmarking address"),
        ("224.0.0.251", "a multicast address"),
        ("255.255.255.255", "a reserved address"),
        ("::", "an unspecified address"),
        ("::1", "a loopback address"),
        ("fe80::1", "a link-local address"),
        ("fe80::1%eth0", "a link-local address"),
        ("fd00::1", "a unique local (private) address"),
        ("ff02::1", "a multicast address"),
        ("2001:db8::1", "a documentation address"),
        ("64:ff9b:1::a00:1", "a local-use NAT64 address"),
        ("4000::1", "a reserved IPv6 address"),
        # The gaps of the issue: IPv6 forms that carry a private IPv4 address.
        ("::7f00:1", "an IPv4-compatible address carrying a loopback address"),
        ("::127.0.0.1", "an IPv4-compatible address carrying a loopback address"),
        ("64:ff9b::7f00:1", "a NAT64 address carrying a loopback address"),
        ("64:ff9b::10.0.0.1", "a NAT64 address carrying a private address"),
        ("::ffff:127.0.0.1", "an IPv4-mapped address carrying a loopback address"),
        ("::ffff:169.254.169.254", "an IPv4-mapped address carrying a link-local address"),
        ("::ffff:0:192.168.0.1", "an IPv4-translated address carrying a private address"),
        ("2002:7f00:1::", "a 6to4 address carrying a loopback address"),
        ("2002:a00:1:5::1", "a 6to4 address carrying a private address"),
        # Teredo: server 65.54.227.120, client 127.0.0.1 stored inverted (RFC 4380 §4).
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "a Teredo address carrying a loopback address"),
        ("not an address", "not an IP address"),
        ("", "not an IP address"),
    ],
)
def test_addresses_a_webhook_may_not_reach(address: str, kind: str) -> None:
    assert refused_address(address) == kind


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "93.184.215.14",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",  # NAT64 of a public address: what NAT64 is for
        "2002:808:808::1",
        "2001:0:808:808:0:0:f7f7:f7f7",  # Teredo, server and client 8.8.8.8
    ],
)
def test_public_addresses_may_be_reached(address: str) -> None:
    assert refused_address(address) is None


_CARRIERS = [
    ipaddress.IPv6Network(n)
    for n in ("::/96", "::ffff:0:0/96", "::ffff:0:0:0/96", "64:ff9b::/96", "2002::/16", "2001::/32")
]


@given(st.ip_addresses(v=4))
def test_an_ipv6_form_of_an_ipv4_address_is_judged_as_that_address(
    v4: ipaddress.IPv4Address,
) -> None:
    value = int(v4)
    kind = refused_address(str(v4))
    for prefix in ("::ffff:0:0", "::ffff:0:0:0", "64:ff9b::"):
        carried = refused_address(
            str(ipaddress.IPv6Address(int(ipaddress.IPv6Address(prefix)) | value))
        )
        assert (carried is None) == (kind is None)
        assert kind is None or (carried is not None and carried.endswith(f"carrying {kind}"))
    sixtofour = refused_address(str(ipaddress.IPv6Address((0x2002 << 112) | (value << 80))))
    assert (sixtofour is None) == (kind is None)
    if value > 1:  # ::0.0.0.0 and ::0.0.0.1 are :: and ::1
        assert (refused_address(str(ipaddress.IPv6Address(value))) is None) == (kind is None)


@given(st.ip_addresses())
def test_every_address_python_calls_non_global_is_refused(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    # Outside the forms that carry an IPv4 address (judged by what they carry: Python calls
    # ::ffff:8.8.8.8 private and ::7f00:1 global), the rule is at least as strict as Python's.
    if isinstance(ip, ipaddress.IPv6Address) and any(ip in n for n in _CARRIERS):
        return
    if not ip.is_global:
        assert refused_address(str(ip)) is not None


@given(st.text())
def test_the_address_rule_never_raises(text: str) -> None:
    result = refused_address(text)
    assert result is None or isinstance(result, str)
