"""ringside.transport: the peers of a process read from /proc, and the advised retransmission floor
applied as real routes with iproute2 in a fresh network namespace of our own (``unshare --user
--map-root-user --net``: no privileges needed, nothing outside it is touched)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import ringside
from ringside.transport import RTPROT_RINGSIDE, RtoRoutes, connected_peers, parse_proc_net_tcp

# /proc/net/tcp6 and tcp as the kernel prints them (header, then one line per socket).
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:7533 0000000000000000FFFF00000400A8C0:E29A 01 00000000:00000000 00:00000000 00000000     0        0 5001 1 0000000000000000 20 4 0 10 -1
   1: 000080FE00000000FF0300000100C2FE:7533 000080FE00000000FF0300000200C2FE:1F90 01 00000000:00000000 00:00000000 00000000     0        0 5002 1 0000000000000000 20 4 0 10 -1
   2: 00000000000000000000000000000000:7533 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5003 1 0000000000000000 100 0 0 10 0
   3: garbage
"""
TCP4 = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 01004D0A:7533 02004D0A:D2A4 01 00000000:00000000 00:00000000 00000000     0        0 6001 1 0000000000000000 20 4 30 10 -1
   1: 01004D0A:7533 03004D0A:D2A6 06 00000000:00000000 00:00000000 00000000     0        0 6002 1 0000000000000000 20 4 30 10 -1
"""


def test_proc_tables_give_established_peers_of_the_given_sockets():
    assert [str(a) for a in parse_proc_net_tcp(TCP4)] == ["10.77.0.2"], "TIME_WAIT (06) is not a peer"
    # IPv4-mapped IPv6 (a dual-stack socket, as PyTorch's store uses) reads as IPv4; listeners
    # (0A) and lines that do not parse are skipped.
    assert [str(a) for a in parse_proc_net_tcp(TCP6)] == ["192.168.0.4", "fe80::3ff:fec2:2"]
    assert [str(a) for a in parse_proc_net_tcp(TCP6, inodes=[5002, 6001])] == ["fe80::3ff:fec2:2"]


def test_connected_peers_are_this_processes_connections_without_loopback():
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s, _ = srv.accept()
    try:
        inodes = [os.fstat(c.fileno()).st_ino, os.fstat(s.fileno()).st_ino]
        with open("/proc/self/net/tcp") as f:
            assert [str(a) for a in parse_proc_net_tcp(f.read(), inodes)] == ["127.0.0.1", "127.0.0.1"]
        assert "127.0.0.1" not in connected_peers(), "loopback is no peer"
    finally:
        for x in (c, s, srv):
            x.close()


class Recorder:
    """Answers `ip` as a host whose peer 10.0.0.2 is on eth0 and 10.0.0.9 has a route of its own."""

    def __init__(self, fail_replace=""):
        self.calls = []
        self.fail_replace = fail_replace

    def __call__(self, argv):
        self.calls.append(list(argv[1:]))
        args = argv[1:]
        if args[1:4] == ["-j", "route", "get"]:
            peer = args[4]
            if peer == "10.0.0.1":
                return 0, json.dumps([{"type": "local", "dst": peer, "dev": "lo"}]), ""
            return 0, json.dumps([{"dst": peer, "dev": "eth0", "prefsrc": "10.0.0.1"}]), ""
        if args[1:4] == ["-j", "route", "show"]:
            return 0, json.dumps([{"dst": "10.0.0.9", "dev": "eth0", "protocol": "static"}] if args[5] == "10.0.0.9/32" else []), ""
        if args[1:3] == ["route", "replace"]:
            return (2, "", self.fail_replace) if self.fail_replace else (0, "", "")
        return 0, "", ""


def test_routes_are_replaced_with_the_floor_and_foreign_or_local_ones_left_alone():
    ip = Recorder()
    r = RtoRoutes(ip="ip", runner=ip)
    problems = r.apply(5, ["10.0.0.1", "10.0.0.2", "10.0.0.9", "nonsense"])
    assert ["-4", "route", "replace", "10.0.0.2/32", "dev", "eth0", "proto", str(RTPROT_RINGSIDE), "rto_min", "5ms", "src", "10.0.0.1"] in ip.calls
    assert r.routes == ["10.0.0.2"] and r.rto_min_ms == 5
    assert len(problems) == 2 and "not ringside's" in problems[0] and "not an IP address" in problems[1], problems
    assert r.apply(0, ["10.0.0.2"]) == ["tcp_rto_min_ms 0 is not a whole number of ms from 1 to 200"]
    assert r.apply(None, []) == [] and r.routes == [] and r.rto_min_ms is None
    assert ["-4", "route", "del", "10.0.0.2/32", "dev", "eth0", "proto", str(RTPROT_RINGSIDE)] in ip.calls

    denied = RtoRoutes(ip="ip", runner=Recorder(fail_replace="RTNETLINK answers: Operation not permitted"))
    (problem,) = denied.apply(5, ["10.0.0.2"])
    assert "needs CAP_NET_ADMIN" in problem and denied.routes == []

    missing = RtoRoutes(ip="/nonexistent/ip")
    (problem,) = missing.apply(5, ["10.0.0.2"])
    assert "ip route get 10.0.0.2 failed" in problem and "/nonexistent/ip" in problem


# Runs inside a new user and network namespace: a veth pair, one end with 10.9.0.1/24 (peer 10.9.0.2 on it)
# and a foreign host route to 10.9.0.3, then the floor applied, read back, and withdrawn.
IN_NAMESPACE = textwrap.dedent(
    """
    import json, subprocess, sys
    from ringside.transport import RtoRoutes

    def ip(*a):
        return subprocess.run(["ip", *a], check=True, capture_output=True, text=True).stdout

    ip("link", "add", "d0", "type", "veth", "peer", "name", "d1")
    ip("addr", "add", "10.9.0.1/24", "dev", "d0")
    ip("link", "set", "d0", "up")
    ip("link", "set", "d1", "up")
    ip("route", "add", "10.9.0.3/32", "dev", "d0")
    r = RtoRoutes()
    out = {"problems": r.apply(7, ["10.9.0.2", "10.9.0.3", "10.9.0.1"])}
    out["during"] = json.loads(ip("-j", "-d", "route", "show", "10.9.0.2/32"))
    out["foreign"] = json.loads(ip("-j", "route", "show", "exact", "10.9.0.3/32"))
    out["got"] = ip("route", "get", "10.9.0.2")
    out["clear"] = r.clear()
    out["after"] = json.loads(ip("-j", "route", "show", "proto", "82"))
    print(json.dumps(out))
    """
)


def test_the_floor_is_a_real_route_in_a_namespace_and_is_removed_again():
    src = os.path.dirname(os.path.dirname(os.path.abspath(ringside.__file__)))
    env = dict(os.environ, PYTHONPATH=src)
    p = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", IN_NAMESPACE], capture_output=True, text=True, timeout=60, env=env
    )
    assert p.returncode == 0, f"unshare --user --map-root-user --net failed (user namespaces must be allowed): {p.stderr}"
    out = json.loads(p.stdout)
    assert out["problems"] == ["a host route to 10.9.0.3/32 exists already and is not ringside's: left as it is"], out
    (route,) = out["during"]
    assert route["dev"] == "d0" and route["protocol"] in ("82", 82), route
    assert "rto_min" in json.dumps(route["metrics"]), route
    assert "rto_min lock 7ms" in out["got"], out["got"]
    assert len(out["foreign"]) == 1 and "rto_min" not in json.dumps(out["foreign"]), "a route that is not ringside's is not changed"
    assert out["clear"] == [] and out["after"] == [], out
