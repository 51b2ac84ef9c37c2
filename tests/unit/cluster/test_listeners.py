"""Listening sockets: /proc/net parsing, and hydra's inherited 0.0.0.0 listener stopped in a rank."""

from __future__ import annotations

import socket

import pytest

from corecpu.cluster.listeners import (Listener, close_inherited_wildcard_listeners, listeners, parse_proc_net,
                                       wildcard_listener_on)

# Rows as the kernel writes them (header, then sl local rem st ... uid timeout inode); the second row is not LISTEN.
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:9371 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 421213 1
   1: 0100007F:A3B1 0100007F:9371 01 00000000:00000000 00:00000000 00000000     0        0 421300 1
   2: 0100007F:0FA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 421400 1
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:B1C5 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 500 1
   1: 00000000000000000000000001000000:0FA1 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 501 1
   2: 0000000000000000FFFF00000100007F:0FA2 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 502 1
"""


def test_proc_net_tables_give_address_port_and_inode():
    assert parse_proc_net(TCP) == [Listener("0.0.0.0", 0x9371, 421213), Listener("127.0.0.1", 4000, 421400)]
    six = parse_proc_net(TCP6)
    assert [(s.address, s.port, s.inode) for s in six] == [("::", 0xB1C5, 500), ("::1", 4001, 501),
                                                          ("::ffff:127.0.0.1", 4002, 502)]
    assert [(s.wildcard, s.loopback) for s in six] == [(True, False), (False, True), (False, True)]
    assert wildcard_listener_on(0xB1C5, six) == six[0] and wildcard_listener_on(4001, six) is None


@pytest.fixture
def sockets():
    made: list[socket.socket] = []

    def listen(ip: str) -> socket.socket:
        s = socket.socket()
        s.bind((ip, 0))
        s.listen(8)
        made.append(s)
        return s

    yield listen
    for s in made:
        s.close()


def _listening(s: socket.socket) -> bool:
    return bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


def test_a_rank_started_by_hydra_stops_the_wildcard_listener_it_holds(sockets):
    # Stands in for hydra_pmi_proxy's fd 5: a 0.0.0.0 listener this process holds from its start.
    wild, loop = sockets("0.0.0.0"), sockets("127.0.0.1")
    assert {wild.getsockname()[1], loop.getsockname()[1]} <= {s.port for s in listeners()}
    stopped = close_inherited_wildcard_listeners({"PMI_FD": "9", "PMI_RANK": "0"})
    assert [s.port for s in stopped] == [wild.getsockname()[1]]
    assert not _listening(wild) and _listening(loop)  # loopback is where a single-host job may listen
    assert wild.getsockname()[1] not in {s.port for s in listeners()}
    assert wild.fileno() >= 0  # the descriptor stays open: the proxy's poll loop still owns its copy


def test_outside_hydra_no_listener_is_touched(sockets):
    wild = sockets("0.0.0.0")
    assert close_inherited_wildcard_listeners({"RANK": "0", "WORLD_SIZE": "2"}) == []
    assert _listening(wild)
