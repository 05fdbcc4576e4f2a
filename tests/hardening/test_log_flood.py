"""Issue 17, finding 2 (the log): one repeating fault wrote 158k lines (76 MB) in 15 s.
The stderr handler now lets one message template print :data:`edgeheal.base.log.BURST` lines per
window and reports how many it held back, so nothing is lost unseen and the journal stays
small. Tested on the real handler and formatter, with an injected clock."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from edgeheal.base.log import LogfmtFormatter, RepeatFilter
from tests.support import Clock


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LogfmtFormatter(timestamps=False))
    clock = Clock()
    repeats = RepeatFilter(handler, burst=10, window=10.0, clock=clock)
    handler.addFilter(repeats)
    logger = logging.getLogger("edgeheal.test.flood")
    logger.propagate = False
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG)
    try:
        yield logger, stream, repeats, clock
    finally:
        logger.handlers.clear()
        logger.propagate = True


def test_a_flood_of_one_message_is_collapsed_and_counted(
        logged: tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]) -> None:
    logger, stream, repeats, clock = logged
    for i in range(20_000):
        logger.error("accept failed on fd %d: %s", i % 7, "Too many open files")
    assert stream.getvalue().count("\n") == 10
    assert repeats.suppressed_total == 20_000 - 10
    clock.advance(10.0)
    logger.error("accept failed on fd %d: %s", 1, "Too many open files")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 12
    assert lines[10] == ('level=error logger=edgeheal.test.flood suppressed=19990 '
                         'msg="suppressed 19990 repeat(s) of \'accept failed on fd %d: %s\' '
                         'in 10s"')
    assert "fd 1" in lines[11]  # a new window starts with the record that closed the old


def test_other_messages_are_not_held_back_by_a_flood(
        logged: tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]) -> None:
    logger, stream, _, _ = logged
    for _ in range(1000):
        logger.warning("flood")
    logger.warning("check %s: ok -> failed", "wireguard")
    logger.error("flood")  # the same text at another level is another message
    text = stream.getvalue()
    assert "check wireguard: ok -> failed" in text
    assert text.count("level=error") == 1


def test_what_is_held_back_is_reported_at_exit(
        logged: tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]) -> None:
    logger, stream, repeats, _ = logged
    for _ in range(25):
        logger.info("again")
    repeats.flush()
    assert stream.getvalue().splitlines()[-1].endswith(
        "msg=\"suppressed 15 repeat(s) of 'again' in 10s\"")
    repeats.flush()  # nothing more to say
    assert stream.getvalue().count("suppressed") == 2  # the key and the message


def test_the_number_of_templates_tracked_is_bounded(
        logged: tuple[logging.Logger, io.StringIO, RepeatFilter, Clock]) -> None:
    logger, stream, repeats, _ = logged
    repeats.max_templates = 16
    for i in range(1000):
        logger.info("message number %d" % i)  # noqa: G002, UP031 - 1000 templates
    assert len(repeats._windows) <= 16
    assert stream.getvalue().count("\n") == 1000  # distinct messages are never suppressed


def test_the_agents_stderr_collapses_a_flood_and_reports_it_at_exit() -> None:
    code = ("import logging; from edgeheal.base import log; log.setup('info'); "
            "lg = logging.getLogger('edgeheal.flood'); "
            "[lg.error('socket.accept() out of system resource') for _ in range(50000)]")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 11, lines[-3:]
    assert "suppressed=49990" in lines[-1]
