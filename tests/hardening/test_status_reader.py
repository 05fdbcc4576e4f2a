"""Issue 17, finding 12: ``edgeheal status`` reads whatever answers, through a real HTTP
server, and always ends with its documented exit code: 0 ready, 1 not ready, 2 a URL that
is not http(s), 3 unreachable or not a status document. It crashed on malformed JSON (exit
1, which reads as "not ready") and read ``file://`` URLs. A table of known-bad answers and
URLs, then a Hypothesis fuzzer over any bytes and any JSON."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgeheal import cli
from edgeheal.cli import status as status_cmd

GOOD: dict[str, Any] = {
    "node": "edge-1", "version": "0.1.0", "uptime_seconds": 12.5, "ready": True,
    "checks": {"tunnel": {"state": "ok", "reason": "ok", "since": "2026-12-01T00:00:00Z",
                          "message": "fine", "required": True}},
    "actions": [{"time": "t", "action": "restart", "result": "ok", "reason": "stalled"}]}


class Answer(BaseHTTPRequestHandler):
    """Answers every GET with what the test put in :attr:`reply`."""

    reply: ClassVar[dict[str, Any]] = {"code": 200, "body": b"{}", "headers": {}}
    wbufsize = 1 << 16  # one send per answer (unbuffered writes meet delayed ACKs)

    def do_GET(self) -> None:
        reply = type(self).reply
        self.send_response(reply["code"])
        for key, value in reply["headers"].items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(reply["body"])))
        self.end_headers()
        with contextlib.suppress(ConnectionError):
            self.wfile.write(reply["body"])

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def serve(body: bytes, code: int = 200, **headers: str) -> None:
    Answer.reply = {"code": code, "body": body, "headers": headers}


def status(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["status", *argv])
    return code, out.getvalue(), err.getvalue()


def _doc(**changes: Any) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


ANSWERS: list[tuple[str, bytes, int, int]] = [
    # (what, body, HTTP code, exit code)
    ("a ready agent", _doc(), 200, 0),
    ("a ready agent, no actions", _doc(actions=[]), 200, 0),
    ("an agent not ready", _doc(ready=False), 200, 1),
    ("HTML", b"<html>hello</html>", 200, 3),
    ("an empty body", b"", 200, 3),
    ("a JSON list", b"[1, 2]", 200, 3),
    ("a JSON string", b'"ready"', 200, 3),
    ("JSON null", b"null", 200, 3),
    ("no ready field", json.dumps({"node": "x"}).encode(), 200, 3),
    ("ready as a string", _doc(ready="yes"), 200, 3),
    ("ready as a number", _doc(ready=1), 200, 3),
    ("checks as a list", _doc(checks=[]), 200, 3),
    ("a check that is a number", _doc(checks={"a": 1}), 200, 3),
    ("actions as an object", _doc(actions={}), 200, 3),
    ("an action that is a string", _doc(actions=["x"]), 200, 3),
    ("uptime as a string", _doc(uptime_seconds="long"), 200, 0),
    ("uptime NaN", _doc().replace(b"12.5", b"NaN"), 200, 0),
    ("uptime Infinity", _doc().replace(b"12.5", b"-Infinity"), 200, 0),
    ("uptime 1e400", _doc().replace(b"12.5", b"1e400"), 200, 0),
    ("uptime true", _doc(uptime_seconds=True), 200, 0),
    ("an integer of 5000 digits", b'{"ready": true, "n": ' + b"9" * 5000 + b"}", 200, 3),
    ("JSON nested 100000 deep", b"[" * 100000 + b"]" * 100000, 200, 3),
    ("not UTF-8", b'{"ready": true, "node": "\xff\xfe"}', 200, 3),
    ("a NUL byte", b'{"ready": true}\x00', 200, 3),
    ("terminal escapes in names", _doc(node="\x1b[2J\x1b[H", checks={
        "\x1b]0;pwned\x07": {"state": "\x1b[31mok", "message": "a\rb\nc\x00"}}), 200, 0),
    ("a very long message", _doc(checks={"a": {"message": "m" * 100000}}), 200, 0),
    ("a body over 4 MiB", b'{"ready": true, "x": "' + b"a" * (5 * 1024 * 1024) + b'"}',
     200, 3),
    ("HTTP 500", b"oops", 500, 3),
    ("HTTP 404 with a status inside", _doc(), 404, 3),
    ("a redirect to a file", b"", 302, 3),
]


def test_every_answer_ends_in_its_exit_code(server: str) -> None:
    handled = 0
    for what, body, code, expected in ANSWERS:
        headers = {"Location": "file:///etc/passwd"} if code == 302 else {}
        serve(body, code, **headers)
        got, out, err = status("--url", server)
        assert got == expected, (what, out, err)
        assert "Traceback" not in err, what
        assert "\x1b" not in out, what
        assert "\x00" not in out, what
        assert "\r" not in out, what
        if expected == 3:
            assert err.startswith("edgeheal: "), (what, err)
            assert len(err) < 600, (what, err)
        handled += 1
    assert handled == len(ANSWERS)


def test_the_table_is_rendered_from_a_good_document(server: str) -> None:
    serve(_doc())
    code, out, _ = status("--url", server)
    assert code == 0
    assert "node edge-1  edgeheal 0.1.0  up 12s  READY" in out
    assert "tunnel *" in out
    assert "action t restart ok: stalled" in out
    code, out, _ = status("--url", server, "--json")
    assert code == 0
    assert json.loads(out) == GOOD


BAD_URLS: list[tuple[str, int, str]] = [
    ("file:///etc/passwd", 2, "scheme 'file'"),
    ("ftp://127.0.0.1/status", 2, "scheme 'ftp'"),
    ("javascript:alert(1)", 2, "scheme 'javascript'"),
    ("127.0.0.1:9917", 2, "http:// or https://"),
    ("http://", 2, "no host"),
    ("http:///status", 2, "no host"),
    ("http://127.0.0.1:99999", 2, "0-65535"),
    ("http://127.0.0.1:port", 2, "0-65535"),
    ("http://127.0.0.1/ status", 2, "spaces or control characters"),
    ("http://127.0.0.1/\x1b[2J", 2, "spaces or control characters"),
    ("", 2, ""),  # an empty --url: the default would be surprising, so usage
    ("http://user:s3cret@127.0.0.1:1", 3, "cannot read http://127.0.0.1:1/status"),
]


def test_urls_that_are_not_http_are_refused_as_usage(capsys: pytest.CaptureFixture[str],
                                                     ) -> None:
    for url, expected, says in BAD_URLS:
        code, out, err = status("--url", url)
        assert code == expected, (url, err)
        assert says in err, (url, err)
        assert "s3cret" not in err + out
        assert "Traceback" not in err


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=25)
_check = st.dictionaries(st.sampled_from(["state", "reason", "since", "message", "required",
                                          "detail"]), _json, max_size=6)
_document = st.fixed_dictionaries(
    {"ready": st.booleans()},
    optional={"node": _json, "version": _json, "uptime_seconds": _json,
              "checks": st.dictionaries(st.text(max_size=12), _check, max_size=4),
              "actions": st.lists(st.dictionaries(st.text(max_size=8), _json, max_size=4),
                                  max_size=3),
              "extra": _json})
_bodies = st.one_of(
    st.binary(max_size=300),
    _json.map(lambda v: json.dumps(v).encode()),
    _document.map(lambda v: json.dumps(v).encode()),
    _document.map(lambda v: json.dumps(v).encode()).flatmap(
        lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),  # cut anywhere
)


@given(body=_bodies)
def test_fuzz_any_answer_is_rendered_or_refused_never_a_traceback(server: str,
                                                                   body: bytes) -> None:
    serve(body)
    code, out, err = status("--url", server)
    assert code in (0, 1, 3), (code, err)
    assert "Traceback" not in err
    assert all(c.isprintable() or c == "\n" for c in out), out
    if code == 3:
        assert err.startswith("edgeheal: ")
        with pytest.raises(status_cmd.StatusError):
            status_cmd.parse_status(body)
    else:
        doc = status_cmd.parse_status(body)
        assert code == (0 if doc["ready"] else 1)
