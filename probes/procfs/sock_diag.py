"""TCP sockets per state through netlink NETLINK_SOCK_DIAG (linux/sock_diag.h, linux/inet_diag.h): the kernel
sends one inet_diag_msg per socket and only its state byte is read, instead of formatting and parsing a text
line per socket as /proc/net/tcp does.

A dump covers the network namespace the netlink socket was created in, and the same sockets /proc/net/tcp{,6}
list: listeners, connections, time-wait sockets (by their substate, time_wait or fin_wait_2) and request
sockets (reported as syn_received). Bound-but-inactive sockets are not in /proc/net/tcp and are not asked for:
newer kernels report them, as closed, for the pseudo-state 13 (TCP_BOUND_INACTIVE) of an all-ones mask.

Each dump walks the whole established hash table (its size follows the memory: 262144 buckets with 23 GiB),
whatever the number of sockets, and that walk is most of the cost: one inet_diag_req_v2 dump per family walks it
twice. The older TCPDIAG_GETSOCK request (struct inet_diag_req, still served as the compatibility path of
inet_diag) asks for both families in one walk; it is used where the kernel accepts it, else one v2 dump per family.

`SockDiag.established_rtts` asks the same dumps for established sockets only, each with its struct tcp_info
(the INET_DIAG_INFO attribute), and reads the smoothed RTT out of it: the tcp_info probe's source."""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
TCPDIAG_GETSOCK, SOCK_DIAG_BY_FAMILY = 18, 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300

NLMSGHDR = struct.Struct("=IHHII")  # nlmsg_len, nlmsg_type, nlmsg_flags, nlmsg_seq, nlmsg_pid
NLMSGHDR_READ = struct.Struct("=IHxxI")  # what a reply is read for: nlmsg_len, nlmsg_type, nlmsg_seq
# inet_diag_req_v2: sdiag_family, sdiag_protocol, idiag_ext, pad, idiag_states, then inet_diag_sockid
# (sport, dport, src[4], dst[4], if, cookie[2]: 48 bytes), all zero for a dump of everything.
INET_DIAG_REQ_V2 = struct.Struct("=BBBBI48x")
# inet_diag_req: idiag_family (AF_UNSPEC: both), src_len, dst_len, idiag_ext, inet_diag_sockid, idiag_states,
# idiag_dbs.
INET_DIAG_REQ = struct.Struct("=BBBB48xII")
ERRNO = struct.Struct("=i")  # the payload of NLMSG_ERROR and NLMSG_DONE
STATE_OFFSET = NLMSGHDR.size + 1  # inet_diag_msg: idiag_family, then idiag_state
TCP_STATES_MASK = sum(1 << state for state in range(1, 13))  # TCP_ESTABLISHED .. TCP_NEW_SYN_RECV
FAMILIES = (socket.AF_INET, socket.AF_INET6)
RECV_BUFFER = 64 * 1024  # a dump part is at most 32 KiB (net/netlink/af_netlink.c), so nothing is truncated
RECV_TIMEOUT_S = 2  # the kernel answers at once; this only keeps a broken kernel from wedging the collector
# Round-trip times: the attribute carrying struct tcp_info, asked for by setting bit INET_DIAG_INFO - 1 of idiag_ext.
TCP_ESTABLISHED_MASK = 1 << 1
INET_DIAG_INFO = 2
INFO_EXT = 1 << (INET_DIAG_INFO - 1)
INET_DIAG_MSG_SIZE = 72  # idiag_family .. idiag_inode; its attributes follow
RTATTR = struct.Struct("=HH")  # rta_len, rta_type
TCPI_RTT = struct.Struct("=I")  # linux/tcp.h struct tcp_info: tcpi_rtt (us, srtt_us >> 3) after 60 bytes of fields
TCPI_RTT_OFFSET = 68
DUMP_DONE, DUMP_MORE, DUMP_FULL = "done", "more", "full"  # what read_rtts says of a dump after each part


def family_request(family: int, seq: int) -> bytes:
    """One inet_diag_req_v2 dump of the TCP sockets of `family`."""
    body = INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, TCP_STATES_MASK)
    return netlink_request(SOCK_DIAG_BY_FAMILY, seq, body)


def one_walk_request(seq: int) -> bytes:
    """One TCPDIAG_GETSOCK dump of the TCP sockets of both families."""
    return netlink_request(TCPDIAG_GETSOCK, seq, INET_DIAG_REQ.pack(socket.AF_UNSPEC, 0, 0, 0, TCP_STATES_MASK, 0))


def rtt_request(seq: int) -> bytes:
    """One TCPDIAG_GETSOCK dump of the established TCP sockets of both families, each with its tcp_info."""
    return netlink_request(TCPDIAG_GETSOCK, seq,
                           INET_DIAG_REQ.pack(socket.AF_UNSPEC, 0, 0, INFO_EXT, TCP_ESTABLISHED_MASK, 0))


def family_rtt_request(family: int, seq: int) -> bytes:
    """One inet_diag_req_v2 dump of the established TCP sockets of `family`, each with its tcp_info."""
    body = INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, INFO_EXT, 0, TCP_ESTABLISHED_MASK)
    return netlink_request(SOCK_DIAG_BY_FAMILY, seq, body)


def netlink_request(kind: int, seq: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def tally_states(buf, size: int, seq: int, kind_wanted: int, counts: list[int]) -> bool:
    """Add the state of each socket in one received part of dump `seq` (its messages are of the request's
    type) to counts[state]; True once the dump is done. Messages of another sequence number (what is left of
    an abandoned dump) are skipped."""
    offset, header = 0, NLMSGHDR_READ.unpack_from  # a local name: this loop runs once per socket
    while offset < size:
        length, kind, msg_seq = header(buf, offset)
        if length < NLMSGHDR.size or offset + length > size:
            raise ValueError(f"sock_diag: malformed netlink message (length {length} at {offset} of {size})")
        if msg_seq == seq:
            if kind == kind_wanted:
                counts[buf[offset + STATE_OFFSET]] += 1
            elif kind in (NLMSG_DONE, NLMSG_ERROR):
                error = ERRNO.unpack_from(buf, offset + NLMSGHDR.size)[0] if length >= NLMSGHDR.size + 4 else 0
                if error < 0:
                    raise OSError(-error, f"sock_diag dump refused: {os.strerror(-error)}")
                return True
        offset += (length + 3) & ~3  # NLMSG_ALIGN
    return False


def tcp_info_rtt(buf, start: int, end: int) -> int:
    """tcpi_rtt of the INET_DIAG_INFO attribute among the attributes in buf[start:end]; 0 when there is none
    (no RTT sample yet reads 0 too)."""
    while start + RTATTR.size <= end:
        length, kind = RTATTR.unpack_from(buf, start)
        if length < RTATTR.size:
            break  # malformed: nothing after it can be found
        if kind == INET_DIAG_INFO and length >= RTATTR.size + TCPI_RTT_OFFSET + TCPI_RTT.size:
            return TCPI_RTT.unpack_from(buf, start + RTATTR.size + TCPI_RTT_OFFSET)[0]
        start += (length + 3) & ~3  # RTA_ALIGN
    return 0


def read_rtts(buf, size: int, seq: int, kind_wanted: int, rtts: list[int], limit: int) -> str:
    """Append the tcpi_rtt of each socket in one received part of dump `seq` to rtts, up to `limit` entries.
    DUMP_DONE once the dump is done, DUMP_FULL at a socket past the limit, else DUMP_MORE (read the next
    part). Messages of another sequence number (what is left of an abandoned dump) are skipped."""
    offset = 0
    while offset < size:
        length, kind, msg_seq = NLMSGHDR_READ.unpack_from(buf, offset)
        if length < NLMSGHDR.size or offset + length > size:
            raise ValueError(f"sock_diag: malformed netlink message (length {length} at {offset} of {size})")
        if msg_seq == seq:
            if kind == kind_wanted:
                if len(rtts) >= limit:
                    return DUMP_FULL
                rtts.append(tcp_info_rtt(buf, offset + NLMSGHDR.size + INET_DIAG_MSG_SIZE, offset + length))
            elif kind in (NLMSG_DONE, NLMSG_ERROR):
                error = ERRNO.unpack_from(buf, offset + NLMSGHDR.size)[0] if length >= NLMSGHDR.size + 4 else 0
                if error < 0:
                    raise OSError(-error, f"sock_diag dump refused: {os.strerror(-error)}")
                return DUMP_DONE
        offset += (length + 3) & ~3  # NLMSG_ALIGN
    return DUMP_MORE


class SockDiag:
    """One netlink socket, kept open between dumps. Raises OSError where sock_diag is refused."""

    def __init__(self, one_walk: bool = True):
        self._sock = self._open()
        self._buf = bytearray(RECV_BUFFER)
        self._seq = 0
        try:
            self.one_walk = one_walk and self._accepts_one_walk()
            self.tcp_states()
        except OSError:
            self._sock.close()
            raise

    @staticmethod
    def _open() -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", RECV_TIMEOUT_S, 0))
            sock.bind((0, 0))
        except OSError:
            sock.close()
            raise
        return sock

    @property
    def method(self) -> str:
        return ("netlink sock_diag (TCPDIAG_GETSOCK, both families in one dump)" if self.one_walk
                else "netlink sock_diag (inet_diag_req_v2, one dump per family)")

    def _accepts_one_walk(self) -> bool:
        try:
            self._dump(one_walk_request, TCPDIAG_GETSOCK, [0] * 256)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):
                return False  # a kernel without the compatibility request
            raise
        return True

    def tcp_states(self) -> list[int]:
        """counts[state] of the TCP sockets of both families, by kernel state number."""
        counts = [0] * 256
        if self.one_walk:
            self._dump(one_walk_request, TCPDIAG_GETSOCK, counts)
        else:
            for family in FAMILIES:
                self._dump(lambda seq: family_request(family, seq), SOCK_DIAG_BY_FAMILY, counts)
        return counts

    def _dump(self, request, kind: int, counts: list[int]) -> None:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self._sock.send(request(self._seq))
        while not tally_states(self._buf, self._sock.recv_into(self._buf), self._seq, kind, counts):
            pass

    def established_rtts(self, limit: int) -> tuple[list[int], bool]:
        """(tcpi_rtt in us of at most `limit` established TCP sockets of both families, in the kernel's hash
        order; whether there were more). A dump cut short is dropped with its netlink socket, and a new one
        opened: netlink refuses another dump on a socket whose dump is unfinished (EBUSY), and the kernel
        fills no more than the part after the last one read."""
        rtts: list[int] = []
        if self.one_walk:
            dumps = [(rtt_request, TCPDIAG_GETSOCK)]
        else:
            dumps = [(lambda seq, family=family: family_rtt_request(family, seq), SOCK_DIAG_BY_FAMILY)
                     for family in FAMILIES]
        for request, kind in dumps:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            self._sock.send(request(self._seq))
            state = DUMP_MORE
            while state == DUMP_MORE:
                state = read_rtts(self._buf, self._sock.recv_into(self._buf), self._seq, kind, rtts, limit)
            if state == DUMP_FULL:
                self._sock.close()
                self._sock = self._open()
                return rtts, True
        return rtts, False

    def close(self) -> None:
        self._sock.close()
