"""Transport advice applied by a job's ranks: a floor for TCP's retransmission timeout on the routes
to the job's peers (``Hint.tcp_rto_min_ms``).

Why: under random loss a lost segment at the tail of a message, or a lost retransmission, is
recovered only by TCP's retransmission timeout, at least 200 ms on Linux, while a collective's
round trip is well under a millisecond. A training job then stalls for 200 ms every few steps, and
no codec removes that (half the bytes, as many stalls). ringside advises a lower floor while the
job's paths lose packets and withdraws it when they are clean again. Linux keeps the timeout at
least the smoothed round trip plus this floor, so a path whose round trip grows keeps a longer one.

How: the floor is a route attribute (``rto_min``, locked), which also reaches connections that are
already open (the kernel re-reads a connection's route after any route change). For every peer the
process has an established TCP connection to, this module adds a host route (``/32`` or ``/128``)
through the device and gateway the kernel uses now, with ``rto_min`` and protocol
:data:`RTPROT_RINGSIDE`, and removes exactly those routes when the advice ends
(:meth:`RtoRoutes.clear`, also at interpreter exit). An existing host route that is not ringside's
is left alone. It runs ``ip`` (iproute2) and needs ``CAP_NET_ADMIN`` in the rank's network
namespace; without them it reports why and changes nothing (the job goes on as it was).

Ranks that share a network namespace (several per host) add and remove the same routes; since every
rank switches at the same step, they agree. Leftovers of a killed job: ``ip route flush proto 82``.

Standard library only.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

__all__ = ["RTPROT_RINGSIDE", "RtoRoutes", "connected_peers", "parse_proc_net_tcp"]

log = logging.getLogger("ringside.transport")

#: The route protocol number that marks ringside's routes (``ip route show proto 82``); unused by
#: the protocols iproute2 names.
RTPROT_RINGSIDE = 82

_ESTABLISHED = "01"
_SOCKET = re.compile(r"^socket:\[(\d+)\]$")

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


def _hex_address(text: str) -> Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in hex, each in host byte order."""
    raw = bytes.fromhex(text)
    # Each 4-byte word is little-endian on the hosts this runs on (x86-64, arm64).
    data = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(data)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def parse_proc_net_tcp(text: str, inodes: Optional[Iterable[int]] = None) -> List[Address]:
    """Remote addresses of the established connections in a ``/proc/net/tcp`` or ``tcp6`` table,
    only those whose socket inode is in ``inodes`` when given (IPv4-mapped IPv6 as IPv4). Lines
    that do not parse are skipped."""
    want = None if inodes is None else set(inodes)
    out: List[Address] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _ESTABLISHED:
            continue
        try:
            inode = int(cols[9])
            addr = _hex_address(cols[2].split(":")[0])
        except ValueError:
            continue
        if want is None or inode in want:
            out.append(addr)
    return out


def _socket_inodes(pid: str = "self") -> List[int]:
    inodes = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            m = _SOCKET.match(os.readlink(os.path.join(fd_dir, fd)))
        except OSError:  # closed meanwhile
            continue
        if m:
            inodes.append(int(m.group(1)))
    return inodes


def connected_peers(exclude: Iterable[str] = ()) -> List[str]:
    """The remote addresses this process has established TCP connections to (a training job's
    peers: gloo's connections, the rendezvous store), without loopback and ``exclude``, sorted."""
    inodes = _socket_inodes()
    found = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                text = f.read()
        except OSError:  # no IPv6 in this kernel
            continue
        found.update(parse_proc_net_tcp(text, inodes))
    skip = set()
    for a in exclude:
        try:
            skip.add(ipaddress.ip_address(a))
        except ValueError:  # a scoped IPv6 address ("fe80::1%eth0") or a name: not a peer anyway
            pass
    return sorted((str(a) for a in found if not a.is_loopback and a not in skip), key=lambda s: (":" in s, s))


Runner = Callable[[Sequence[str]], Tuple[int, str, str]]


def _run(argv: Sequence[str]) -> Tuple[int, str, str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    return p.returncode, p.stdout, p.stderr


class RtoRoutes:
    """The host routes that carry the advised floor, added and removed by this process.

    ``apply(ms, peers)`` sets the floor on the routes to ``peers`` (``None`` removes ours);
    ``clear()`` removes every route this object added. Both return a list of problems (empty when
    all went well) and never raise: transport advice fails open. ``runner`` runs one ``ip``
    command (tests pass their own); ``ip`` is the iproute2 binary.
    """

    def __init__(self, ip: Optional[str] = None, runner: Optional[Runner] = None):
        self._ip = ip or shutil.which("ip") or "ip"
        self._run = runner or _run
        self._lock = threading.Lock()
        #: peer -> the `ip route` arguments that name its route (prefix and device).
        self._added: Dict[str, List[str]] = {}
        self.rto_min_ms: Optional[int] = None
        self._atexit = False

    @property
    def routes(self) -> List[str]:
        """The peers whose host route this object added (and has not removed)."""
        with self._lock:
            return sorted(self._added)

    def _ip_cmd(self, family: str, *args: str) -> Tuple[int, str, str]:
        try:
            return self._run([self._ip, family, *args])
        except (OSError, subprocess.SubprocessError) as e:
            return 127, "", f"{self._ip}: {e}"

    def apply(self, rto_min_ms: Optional[int], peers: Iterable[str]) -> List[str]:
        if rto_min_ms is None:
            return self.clear()
        if isinstance(rto_min_ms, bool) or not isinstance(rto_min_ms, int) or not (1 <= rto_min_ms <= 200):
            return [f"tcp_rto_min_ms {rto_min_ms!r} is not a whole number of ms from 1 to 200"]
        problems: List[str] = []
        with self._lock:
            for peer in peers:
                p = self._route_one(peer, rto_min_ms)
                if p:
                    problems.append(p)
            self.rto_min_ms = rto_min_ms
            if self._added and not self._atexit:
                atexit.register(self.clear)
                self._atexit = True
        return problems

    def _route_one(self, peer: str, ms: int) -> Optional[str]:
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return f"{peer!r} is not an IP address"
        family, plen = ("-4", 32) if addr.version == 4 else ("-6", 128)
        prefix = f"{addr}/{plen}"
        code, out, err = self._ip_cmd(family, "-j", "route", "get", str(addr))
        if code != 0:
            return f"ip route get {addr} failed: {err.strip() or f'exit {code}'}"
        try:
            route = json.loads(out)[0]
            dev = route["dev"]
        except (ValueError, LookupError, TypeError):
            return f"ip route get {addr}: unexpected output {out[:120]!r}"
        if dev == "lo" or route.get("type") == "local":
            return None  # this host: no wire, no timeout to tune
        if peer not in self._added:
            code, out, _ = self._ip_cmd(family, "-j", "route", "show", "exact", prefix)
            if code == 0 and out.strip() not in ("", "[]"):
                try:
                    mine = all(str(r.get("protocol")) == str(RTPROT_RINGSIDE) for r in json.loads(out))
                except (ValueError, AttributeError, TypeError):
                    mine = False
                if not mine:
                    return f"a host route to {prefix} exists already and is not ringside's: left as it is"
        args = [prefix, "dev", dev]
        if route.get("gateway"):
            args += ["via", route["gateway"]]
        cmd = ["route", "replace", *args, "proto", str(RTPROT_RINGSIDE), "rto_min", f"{ms}ms"]
        if route.get("prefsrc"):
            cmd += ["src", route["prefsrc"]]
        code, _, err = self._ip_cmd(family, *cmd)
        if code != 0:
            hint = " (needs CAP_NET_ADMIN in this network namespace)" if "permitted" in err.lower() else ""
            return f"ip route replace {prefix} rto_min {ms}ms failed: {err.strip() or f'exit {code}'}{hint}"
        self._added[peer] = [family, prefix, "dev", dev]
        return None

    def clear(self) -> List[str]:
        problems: List[str] = []
        with self._lock:
            left: Dict[str, List[str]] = {}
            for peer, spec in sorted(self._added.items()):
                family, *route = spec
                code, _, err = self._ip_cmd(family, "route", "del", *route, "proto", str(RTPROT_RINGSIDE))
                if code != 0 and "no such process" not in err.lower():  # already gone is fine
                    problems.append(f"ip route del {route[0]} failed: {err.strip() or f'exit {code}'}")
                    left[peer] = spec
            self._added = left
            self.rto_min_ms = None
        return problems
