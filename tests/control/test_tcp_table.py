"""The kernel's TCP table as the check reads it, from this process's own loopback sockets:
IPv4 and IPv6, the port filter, and a LISTEN row."""

from __future__ import annotations

import socket

import pytest

from edgeheal.boundaries.kernel import tcp_sockets


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"),
                                              (socket.AF_INET6, "::1")])
def test_a_loopback_connection_reads_back_with_its_addresses(family: int, host: str) -> None:
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    client = socket.create_connection((host, port), timeout=5.0)
    served, _ = listener.accept()
    try:
        every = tcp_sockets.table(ports={port})
        mine = client.getsockname()[:2]
        # another test's closed connection on the same port number may linger in
        # TIME_WAIT: keep this test's own rows (the listener, both ends of the connection)
        rows = [r for r in every if (r.state == "listen" and r.local == (host, port))
                or mine in (r.local, r.remote)]
        assert {r.state for r in rows} == {"listen", "established"}
        assert len(rows) == 3
        (out,) = [r for r in rows if r.local == mine]
        assert out.remote == (host, port)
        assert (out.unacked, out.retransmits, out.probes) == (0, 0, 0)
        (listen,) = [r for r in rows if r.state == "listen"]
        assert listen.local == (host, port)
        assert all(port in (r.local[1], r.remote[1]) for r in every)
        assert len(tcp_sockets.table()) >= len(every)  # unfiltered: at least these
    finally:
        for sock in (client, served, listener):
            sock.close()


def test_a_missing_table_is_an_error_naming_it(tmp_path: object) -> None:
    with pytest.raises(tcp_sockets.TcpTableError, match="no tcp table"):
        tcp_sockets.table(str(tmp_path))
