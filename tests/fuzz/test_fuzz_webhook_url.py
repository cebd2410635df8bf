"""Fuzzing the webhook URL rule and the webhook caller: any string, and strings shaped like
URLs (good and bad schemes, user names, names, IPv4 and IPv6 hosts in odd forms, ports of every
kind), go into `parse_webhook_url`, which never raises; what it accepts the HTTP client parses
the same way, and a call to it never raises either, whatever its name resolves to.

The calls run without a network: names resolve through trio's custom-resolver hook to the
addresses the example draws, and the connection is httpcore's mock backend answering 204.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import httpcore
import httpx
import idna
import trio
from hypothesis import given
from hypothesis import strategies as st

from snerd.core.webhook_target import (
    BadWebhookUrl,
    WebhookTarget,
    parse_webhook_url,
    refused_address,
)
from snerd.io.webhook import WebhookCaller

#: Hosts that have crashed, or fooled, URL parsers.
_ODD_HOSTS = [
    "127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1", "1.2.3.4.", "256.1.1.1", "[::1", "::1",
    "[::1]x", "[fe80::1%25eth0]", "[v1.x]", "", "xn--zz", "a..b", "é.com", "a@b", "a\\b",
]  # fmt: skip
_labels = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)
_names = st.builds(
    lambda labels, dot: ".".join(labels) + dot,
    st.lists(_labels, min_size=1, max_size=4),
    st.sampled_from(["", "."]),
)
_hosts = st.one_of(
    _names,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.ip_addresses(v=6).map(lambda a: f"[{a.exploded.upper()}]"),
    st.sampled_from(_ODD_HOSTS),
    st.text(max_size=12),
)
_ports = st.one_of(
    st.just(""),
    st.just(""),
    st.integers(1, 65535).map(lambda p: f":{p}"),
    st.just(":"),
    st.integers(-5, 200_000).map(lambda p: f":{p}"),
    st.from_regex(r":0*[0-9]{1,6}", fullmatch=True),
    st.text(max_size=6).map(lambda t: ":" + t),
)
#: Text a URL may hold after its host (mostly), and now and then anything.
_tail_text = st.one_of(
    st.text(
        st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")),
        max_size=30,
    ),
    st.text(max_size=10),
)
_urls = st.builds(
    lambda scheme, sep, user, host, port, rest: f"{scheme}{sep}{user}{host}{port}{rest}",
    st.sampled_from(["http", "https", "HTTP", "hTTpS"] * 3 + ["ftp", "", "http+x", "javascript"]),
    st.sampled_from(["://"] * 6 + [":/", ":", "//", ":///"]),
    st.one_of(
        st.just(""), st.just(""), st.just(""), st.from_regex(r"[a-z:]{0,5}@", fullmatch=True)
    ),
    _hosts,
    _ports,
    st.one_of(
        st.just(""),
        _tail_text.map(lambda t: "/" + t),
        _tail_text.map(lambda t: "?" + t),
        _tail_text.map(lambda t: "#" + t),
    ),
)
#: URLs the rule should mostly accept: a scheme, a name or an address, perhaps a port.
_plausible_urls = st.builds(
    lambda scheme, host, port, rest: f"{scheme}://{host}{port}{rest}",
    st.sampled_from(["http", "https", "HTTP", "hTTpS"]),
    st.one_of(
        _names,
        st.ip_addresses(v=4).map(str),
        st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    ),
    st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}")),
    st.one_of(st.just(""), _tail_text.map(lambda t: "/" + t)),
)
_any_urls = st.one_of(_plausible_urls, _urls)
#: What a name resolves to: mostly public addresses, now and then any address at all.
_resolved = st.lists(
    st.one_of(
        st.sampled_from(["93.184.215.14", "8.8.4.4", "2606:4700::1111", "64:ff9b::808:808"]),
        st.ip_addresses().map(str),
    ),
    min_size=1,
    max_size=3,
)


def _check(url: str) -> WebhookTarget | BadWebhookUrl:
    result = parse_webhook_url(url)
    assert isinstance(result, WebhookTarget | BadWebhookUrl)
    if isinstance(result, BadWebhookUrl):
        assert result.reason.startswith("webhook_url ")
        # Reasons quote a scheme, a port or one character, at most 21 characters: never a URL.
        assert len(url) <= 21 or url not in result.reason
    return result


@given(st.text(max_size=200))
def test_fuzz_any_string_is_judged_without_raising(url: str) -> None:
    _check(url)


@given(_any_urls)
def test_fuzz_url_shaped_strings_are_judged_as_the_http_client_parses_them(url: str) -> None:
    target = _check(url)
    if isinstance(target, BadWebhookUrl):
        return
    try:
        parsed = httpx.URL(url)
    except idna.IDNAError:
        # An xn-- label that is not valid punycode: the rule leaves international names to
        # the HTTP client, whose refusal is the call's (failed) outcome.
        assert any(label.startswith("xn--") for label in target.host.split("."))
        return
    assert parsed.scheme == target.scheme
    assert (parsed.port or {"http": 80, "https": 443}[parsed.scheme]) == target.port
    if target.literal:
        assert ipaddress.ip_address(parsed.host) == ipaddress.ip_address(target.host)
    else:
        assert parsed.raw_host.decode("ascii") == target.host


class _Answers(trio.abc.HostnameResolver):
    """Every name resolves to `addresses`."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        number = int(port) if port is not None else 0
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (a, number, 0, 0) if ":" in a else (a, number),
            )
            for a in self.addresses
        ]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


def _call(url: Any, addresses: list[str], **fields: Any) -> tuple[bool, str | None]:
    async def run() -> tuple[bool, str | None]:
        trio.socket.set_custom_hostname_resolver(_Answers(addresses))
        network = httpcore.AsyncMockBackend([b"HTTP/1.1 204 No Content\r\n\r\n"])
        caller = WebhookCaller(allow="", secret="k", network=network)
        try:
            return await caller.call(url=url, timeout_s=5, **fields)
        finally:
            await caller.aclose()

    return trio.run(run)


_TASK = {"event": "Execute", "task_id": "w1", "task_type": "notify", "data": "{}"}


@given(_any_urls, _resolved)
def test_fuzz_a_call_to_any_url_never_raises_and_succeeds_only_where_allowed(
    url: str, addresses: list[str]
) -> None:
    ok, why = _call(url, addresses, **_TASK)
    target = parse_webhook_url(url)
    if isinstance(target, BadWebhookUrl):
        assert (ok, why) == (False, f"Webhook request refused: {target.reason}")
        return
    if any(label.startswith("xn--") for label in target.host.split(".")) and not ok:
        return  # an A-label the HTTP client refuses (see above)
    reached = [target.host] if target.literal else addresses
    allowed = all(refused_address(a) is None for a in reached)
    assert ok == allowed, (url, addresses, why)
    if not ok:
        assert why is not None and why.startswith("Webhook request refused: the host ")
        assert not any(a in why for a in reached)


@given(
    st.one_of(st.none(), st.integers(), st.text(), st.lists(st.text(max_size=3), max_size=2)),
    st.text(max_size=20),
    st.text(max_size=20),
    st.text(max_size=20),
)
def test_fuzz_whatever_a_record_holds_a_call_returns_an_outcome(
    url: Any, task_type: str, data: str, event: str
) -> None:
    # Records from an older version or written by hand: any JSON value as the URL, any text
    # (lone surrogates too, which the encoder refuses) as the task's fields.
    fields = {"event": event, "task_id": "w1", "task_type": task_type, "data": data}
    ok, why = _call(url, ["93.184.215.14"], **fields)
    assert isinstance(ok, bool)
    assert ok or isinstance(why, str)
