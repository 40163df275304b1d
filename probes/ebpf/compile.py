"""Compile, load and attach one BPF C program with bcc, then hand its descriptors to the parent and exit.

    python compile.py SOCKET_FD < request.json

Run by probes/ebpf/loader.py as a short-lived child, so that bcc, clang and LLVM (over a hundred MiB once a
program is compiled) never enter the long-running collector. The request names the source, the cflags, the
maps the parent reads or fills, and syscall names to resolve to numbers. Through the Unix socket SOCKET_FD
comes back one JSON message with the descriptors beside it (SCM_RIGHTS): each named map's, then each
attachment's (an attachment lasts as long as any descriptor of it is open, so the parent's copies keep the
program attached after this process is gone). On failure the message is {"error": "..."} and nothing is
attached.

This file imports nothing of the project: it starts fast and stays valid wherever the venv can import bcc.
"""

import json
import os
import socket
import sys


def resolve_syscalls(names):
    from bcc.syscall import syscalls  # bcc only in functions: see load()

    numbers = {name.decode(): nr for nr, name in syscalls.items()}
    return {name: numbers[name] for name in names if name in numbers}


def load(request):
    """(reply, descriptors) for a request. bcc's exit handler keeps the BPF object alive until main exits."""
    # bcc (Debian's python3-bpfcc) is optional, and importing it loads libbcc: imported here, a missing or broken
    # one goes back to the parent as the probe's failure, and every module of probes/ imports without it
    from bcc import BPF
    from bcc.libbcc import lib

    bpf = BPF(src_file=request["source"].encode(), cflags=request["cflags"])  # attaches *TRACEPOINT_PROBEs
    maps, fds = [], []
    for name in request["maps"]:
        fd = lib.bpf_table_fd(bpf.module, name.encode())
        if fd < 0:
            raise RuntimeError(f"map {name} not in {request['source']}")
        maps.append(name)
        fds.append(fd)
    links = [*bpf.tracepoint_fds.values(), *bpf.raw_tracepoint_fds.values()]
    if not links:
        raise RuntimeError(f"{request['source']} attached nothing")
    reply = {"maps": maps, "links": len(links), "syscalls": resolve_syscalls(request.get("syscalls", ()))}
    return reply, fds + links


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        reply, fds = load(json.loads(sys.stdin.read()))
    except Exception as exc:  # everything goes back to the parent, which reports it as the probe's failure
        sock.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
    else:
        socket.send_fds(sock, [json.dumps(reply).encode()], fds)
    sock.close()
    sys.stdout.flush()
    # _exit: bcc's exit handler would detach the programs (disabling perf events the parent now shares)
    os._exit(0)


if __name__ == "__main__":
    main()
