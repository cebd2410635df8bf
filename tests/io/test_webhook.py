"""Webhooks in the shell (snerd.io.webhook) and in a real daemon: calls, the SSRF guard, and bad
URLs, which fail their task and never the daemon.

The calls go to a small HTTP server on 127.0.0.1 in the test (`HookServer`). Names resolve
through trio's custom-resolver hook (`Names`), so a test decides what a name answers and sees
how often it was asked; `Redirect` is the network the checked addresses are connected to, and
sends a public address the test made up to the local server instead.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpcore
import pytest
import trio

from snerd.core.records import decode_record
from snerd.io.webhook import WebhookCaller
from tests.cli.test_cli import plant, task
from tests.support.daemon import Daemon

PUBLIC = "93.184.215.14"  # a public address no test reaches: `Redirect` diverts it


class HookServer:
    """An HTTP/1.1 server answering every request with `status`; it keeps what it was sent."""

    def __init__(self, status: int = 200, tls: ssl.SSLContext | None = None) -> None:
        self.status = status
        self.tls = tls
        self.requests: list[dict[str, Any]] = []
        self.port = 0

    async def start(self, nursery: trio.Nursery) -> HookServer:
        listeners = await nursery.start(trio.serve_tcp, self._handle, 0)
        self.port = listeners[0].socket.getsockname()[1]
        return self

    async def _handle(self, stream: trio.abc.Stream) -> None:
        if self.tls is not None:
            stream = trio.SSLStream(stream, self.tls, server_side=True)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
        except trio.BrokenResourceError:  # a TLS handshake the client gave up
            return
        head, _, body = data.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)
        }
        while len(body) < int(headers.get("content-length", "0")):
            body += await stream.receive_some(65536)
        method, target, _ = request_line.split(" ")
        self.requests.append({"method": method, "target": target, "headers": headers, "body": body})
        reason = b"OK" if self.status == 200 else b"Other"
        await stream.send_all(
            b"HTTP/1.1 %d %s\r\nContent-Length: 2\r\nLocation: http://127.0.0.1:1/\r\n\r\nok"
            % (self.status, reason)
        )
        await stream.aclose()


class Names(trio.abc.HostnameResolver):
    """Name resolution for the test: each name answers its lists of addresses in turn (the last
    one again and again); every question is counted."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def getaddrinfo(
        self,
        host: bytes | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        self.asked.append(name)
        turns = self.answers.get(name.rstrip("."))  # a fully qualified name is the same name
        if not turns:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        addresses = turns.pop(0) if len(turns) > 1 else turns[0]
        number = int(port) if port is not None else 0
        return [
            (
                socket.AF_INET6 if ":" in a else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (a, number, 0, 0) if ":" in a else (a, number),
            )
            for a in addresses
        ]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        raise NotImplementedError


class Redirect:
    """The network checked addresses are connected to: `PUBLIC` goes to 127.0.0.1 (where the
    test's server listens), and every address asked for is kept."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self._real = httpcore.TrioBackend()

    async def connect_tcp(self, host: str, port: int, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        self.asked.append((host, port))
        return await self._real.connect_tcp("127.0.0.1" if host == PUBLIC else host, port, **kwargs)

    async def connect_unix_socket(self, path: str, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise AssertionError("no Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class Broken(Redirect):
    """A network that fails in a way no rule foresaw."""

    async def connect_tcp(self, host: str, port: int, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise RuntimeError("an unforeseen bug, quoting http://secret.example/")


def caller(allow: str = "", secret: str = "", network: Any = None) -> WebhookCaller:
    return WebhookCaller(allow=allow, secret=secret, network=network)


async def post(
    c: WebhookCaller, url: str, timeout_s: float = 10.0, **kw: Any
) -> tuple[bool, str | None]:
    fields = {"event": "Execute", "task_id": "w1", "task_type": "notify", "data": '{"user":7}'}
    fields.update(kw)
    try:
        return await c.call(url=url, timeout_s=timeout_s, **fields)
    finally:
        await c.aclose()


# ------------------------------------------------------------------ calls


async def test_a_call_posts_the_task_signed_and_succeeds_on_2xx(nursery: trio.Nursery) -> None:
    server = await HookServer().start(nursery)
    url = f"http://127.0.0.1:{server.port}/hook?x=1"
    assert await post(caller(allow="127.0.0.1", secret="s3cret"), url) == (True, None)
    [request] = server.requests
    assert (request["method"], request["target"]) == ("POST", "/hook?x=1")
    assert request["body"] == b'{"taskId":"w1","taskType":"notify","data":"{\\"user\\":7}"}'
    assert request["headers"]["x-snerdmq-event"] == "Execute"
    assert request["headers"]["host"] == f"127.0.0.1:{server.port}"
    assert request["headers"]["x-snerdmq-signature"] == (
        "sha256=368a27e0744b194c12d84233778c1c6e1e74973d7657f48cb83c07d6e180868e"
    )


@pytest.mark.parametrize("status", [302, 404, 500])
async def test_another_status_fails_and_a_redirect_is_not_followed(
    nursery: trio.Nursery, status: int
) -> None:
    server = await HookServer(status=status).start(nursery)
    ok, why = await post(caller(allow="private"), f"http://127.0.0.1:{server.port}/")
    assert (ok, why) == (False, f"Webhook returned non-2xx status: {status}")
    assert len(server.requests) == 1


# ------------------------------------------------------------------ bad URLs never raise


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:99999/x", "webhook_url port 99999 is out of range (1-65535)"),
        ("http://h:abc/x", "webhook_url port 'abc' is not a number"),
        ("http://[::1/x", "webhook_url has a '[' without its ']' around an IPv6 address"),
        (7, "webhook_url must be a string"),
        ("", "webhook_url must be an http:// or https:// URL"),
    ],
)
async def test_a_bad_url_fails_the_call_instead_of_raising(url: Any, reason: str) -> None:
    # Before: urlsplit(url).port raised ValueError out of the call, into the daemon's nursery.
    assert await post(caller(), url) == (False, f"Webhook request refused: {reason}")


async def test_any_failure_of_a_call_is_its_outcome() -> None:
    names = Names({"secret.example": [[PUBLIC]]})
    trio.socket.set_custom_hostname_resolver(names)
    ok, why = await post(caller(network=Broken()), "http://secret.example/")
    assert (ok, why) == (
        False,
        "Webhook request failed: snerd could not make the call (RuntimeError)",
    )
    # Data no encoder takes (a lone surrogate: the embedded engine passes any str).
    ok, why = await post(caller(network=Redirect()), "http://secret.example/", data="\ud800")
    assert (ok, why) == (False, "Webhook request failed: snerd could not make the call (TypeError)")


# ------------------------------------------------------------------ the SSRF guard


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("[::7f00:1]", "an IPv4-compatible address carrying a loopback address"),
        ("[::127.0.0.1]", "an IPv4-compatible address carrying a loopback address"),
        ("[64:ff9b::7f00:1]", "a NAT64 address carrying a loopback address"),
        ("[::ffff:169.254.169.254]", "an IPv4-mapped address carrying a link-local address"),
        ("[2002:a00:1::]", "a 6to4 address carrying a private address"),
        ("127.0.0.1", "a loopback address"),
        ("[::1]", "a loopback address"),
    ],
)
async def test_an_address_that_carries_a_private_one_is_refused(host: str, kind: str) -> None:
    network = Redirect()
    ok, why = await post(caller(network=network), f"http://{host}:8080/x")
    assert (ok, why) == (
        False,
        f"Webhook request refused: the host is {kind}; allow it with SNERD_WEBHOOK_ALLOW",
    )
    assert network.asked == []  # refused before any connection


async def test_a_refusal_names_the_kind_of_address_never_the_host() -> None:
    # Dead letters show their error, and the docs promise that URLs are never shown.
    trio.socket.set_custom_hostname_resolver(Names({"billing.internal.example": [["10.20.30.40"]]}))
    ok, why = await post(caller(), "https://billing.internal.example/hook?token=abc")
    assert (ok, why) == (
        False,
        "Webhook request refused: the host name resolves to a private address; "
        "allow it with SNERD_WEBHOOK_ALLOW",
    )


async def test_failures_name_neither_the_host_nor_its_address(nursery: trio.Nursery) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    trio.socket.set_custom_hostname_resolver(Names({"gone.example": [["127.0.0.1"]]}))
    ok, why = await post(caller(allow="private"), f"http://gone.example:{port}/")
    assert not ok and why is not None
    assert why.startswith("Webhook request failed: ConnectError: cannot connect to the host (")
    assert "ECONNREFUSED" in why
    assert "127.0.0.1" not in why and "gone.example" not in why and str(port) not in why
    ok, why = await post(caller(), "http://unknown.example/")
    assert not ok and why is not None
    assert why.startswith("Webhook request failed: the host name does not resolve (")
    assert "unknown.example" not in why


async def test_every_address_a_name_resolves_to_is_checked() -> None:
    trio.socket.set_custom_hostname_resolver(Names({"mixed.example": [[PUBLIC, "127.0.0.2"]]}))
    network = Redirect()
    ok, why = await post(caller(network=network), "http://mixed.example/")
    assert not ok and why is not None and "resolves to a loopback address" in why
    assert network.asked == []


async def test_the_connection_goes_to_the_address_that_was_checked(nursery: trio.Nursery) -> None:
    # DNS rebinding: the name answers a public address to the check, then loopback. Before, the
    # guard and the HTTP client each resolved it, and the client connected to loopback.
    server = await HookServer().start(nursery)
    names = Names({"rebind.example": [[PUBLIC], ["127.0.0.1"]]})
    trio.socket.set_custom_hostname_resolver(names)
    network = Redirect()
    url = f"http://rebind.example:{server.port}/hook"
    assert await post(caller(network=network), url) == (True, None)
    assert names.asked == ["rebind.example"]  # resolved once
    assert network.asked == [(PUBLIC, server.port)]  # and connected to what was checked
    assert server.requests[0]["headers"]["host"] == f"rebind.example:{server.port}"


async def test_allowed_hosts_skip_the_check_but_still_resolve_once(nursery: trio.Nursery) -> None:
    server = await HookServer().start(nursery)
    names = Names({"hooks.internal.example": [["127.0.0.1"]]})
    trio.socket.set_custom_hostname_resolver(names)
    url = f"http://Hooks.Internal.Example.:{server.port}/"
    assert await post(caller(allow="other.example, hooks.internal.example"), url) == (True, None)
    assert names.asked == ["hooks.internal.example."]
    ok, why = await post(caller(allow="other.example"), url)
    assert not ok and why is not None and "loopback" in why


def _self_signed(directory: Path) -> ssl.SSLContext:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=other.example", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_https_sends_and_verifies_the_host_name(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Connecting to the checked address must not change whom TLS talks to: the server name
    # (SNI) is the URL's host, and the certificate is checked against it (and fails here: it is
    # self-signed, for another name). The failure's text names neither.
    context = _self_signed(tmp_path)
    server_names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: server_names.append(name)  # type: ignore[assignment,func-returns-value]
    server = await HookServer(tls=context).start(nursery)
    trio.socket.set_custom_hostname_resolver(Names({"tls.example": [[PUBLIC]]}))
    ok, why = await post(caller(network=Redirect()), f"https://tls.example:{server.port}/")
    assert server_names == ["tls.example"]
    assert not ok and why is not None and "CERTIFICATE_VERIFY_FAILED" in why
    assert "tls.example" not in why and server.requests == []


# ------------------------------------------------------------------ a real daemon


BAD_URLS = [
    ("http://127.0.0.1:99999/x", "webhook_url port 99999 is out of range (1-65535)"),
    ("http://h:abc/x", "webhook_url port 'abc' is not a number"),
    ("http://[::1/x", "webhook_url has a '[' without its ']' around an IPv6 address"),
    ("http://u:p@example.com/", "webhook_url must not carry a user name or password"),
    ("http://example.com/a b", "webhook_url must not contain whitespace or control characters"),
    ("http://2130706433/", "webhook_url has a host that ends in a number"),
    ("http://example.com/" + "x" * 3000, "webhook_url is 3019 bytes; the limit is 2048"),
]


async def test_a_daemon_refuses_bad_webhook_urls_before_the_ack(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    # Before: the first was acked, then the daemon died (and so would every daemon after it).
    d = await Daemon.start(nursery, tmp_path / "q")
    await d.wait_for(lambda m: m["action"] == "membership")
    for n, (url, reason) in enumerate(BAD_URLS):
        await d.enqueue(f"bad-{n}", webhook_url=url)
        reply = await d.wait_for(lambda m: m.get("task_id") == f"bad-{n}")  # noqa: B023
        assert reply["action"] == "error", reply
        assert reply["message"].startswith(f"Failed to enqueue: {reason}"), reply
    await d.enqueue("after")
    assert (await d.wait_for(lambda m: m.get("task_id") == "after"))["action"] == "ack"
    await d.send({"action": "stats"})
    stats = await d.wait_for(lambda m: m["action"] == "stats")
    assert stats["total_enqueued"] == 1 and d.alive
    await d.close_stdin()
    assert await d.wait() == 0


def _records(directory: Path) -> list[dict[str, Any]]:
    data = (directory / "shard-0" / "tasks" / "tasks.log").read_bytes()
    return [decode_record(line) for line in data.splitlines() if line.strip()]


async def _dead_letters(d: Daemon, directory: Path, count: int) -> dict[str, str]:
    """Wait until `count` tasks are dead letters; their final errors by task id."""
    with trio.fail_after(30):
        while True:
            await d.send({"action": "stats"})
            stats = await d.wait_for(lambda m: m["action"] == "stats")
            if stats["total_dlq"] >= count:
                break
            await trio.sleep(0.05)
    return {
        r["taskId"]: r["LastErrorObj"]
        for r in _records(directory)
        if r.get("snerdOutcome") == "dead_letter"
    }


async def test_a_bad_url_already_in_a_log_dead_letters_its_task_not_the_daemon(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    # Tasks written by an older version (or by hand) that no enqueue would take now. Before, the
    # daemon died at the first, restarted, and died again. The record rule refuses them as the
    # enqueue does: each is dead-lettered when the shard is loaded, its URL never called.
    q = plant(
        tmp_path / "q",
        {
            0: [
                task("port", webhookUrl="http://127.0.0.1:99999/x", maxRetries=1),
                task("colon", webhookUrl="http://[::1/x", maxRetries=0),
                task("number", webhookUrl=7, maxRetries=0),
                task("plain", maxRetries=0),
            ]
        },
    )
    d = await Daemon.start(nursery, q, env={"SNERD_WEBHOOK_ALLOW": ""})
    await d.send({"action": "register", "task_type": "job"})
    execute = await d.wait_for(lambda m: m["action"] == "execute")
    assert execute["task_id"] == "plain"  # the others never reach the SDK
    await d.send({"action": "result", "task_id": "plain", "status": "success"})
    errors = await _dead_letters(d, q, 3)
    assert errors == {
        "port": "task port's record: webhookUrl port 99999 is out of range (1-65535)",
        "colon": "task colon's record: webhookUrl has a '[' without its ']' around an IPv6 "
        "address",
        "number": "task number's record has webhookUrl 7, not a string",
    }
    await d.wait_stderr("task port's record: webhookUrl port 99999 is out of range (1-65535) (at")
    await d.send({"action": "stats"})
    stats = await d.wait_for(lambda m: m["action"] == "stats")
    assert stats["queue_depth"] == 0 and stats["total_dlq"] == 3 and d.alive
    await d.close_stdin()
    assert await d.wait() == 0


async def test_a_refused_webhook_dead_letters_without_its_host(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    d = await Daemon.start(nursery, tmp_path / "q", env={"SNERD_WEBHOOK_ALLOW": ""})
    await d.wait_for(lambda m: m["action"] == "membership")
    await d.enqueue("local", webhook_url="http://localhost:1/private?token=abc")
    assert (await d.wait_for(lambda m: m.get("task_id") == "local"))["action"] == "ack"
    errors = await _dead_letters(d, tmp_path / "q", 1)
    assert errors == {
        "local": "Webhook request refused: the host name resolves to a loopback address; "
        "allow it with SNERD_WEBHOOK_ALLOW"
    }
    stderr = await d.wait_stderr("task local: dead-letter webhook failed")
    assert "localhost" not in stderr and "token" not in stderr
    await d.close_stdin()
    assert await d.wait() == 0
