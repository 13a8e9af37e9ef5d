#!/usr/bin/env python3
"""The kernel's share of one streamed token: CPU time of one small write to a loopback TCP
connection whose reader waits for it, the floor under any server's per-token cost here.

    python3 bench/loopback_floor.py [CONNECTIONS] [WRITES] [BYTES]

A child process holds CONNECTIONS connections with a reader thread each; this process writes
BYTES-byte messages round-robin, pausing 5 ms after each round (a step's worth of tokens, then
the next step), and prints its own CPU time (user and system) per write. On loopback, the
receiver's TCP processing runs in the sender's system call, so the system time includes it.
"""
import os
import resource
import socket
import sys
import threading
import time


def main():
    connections = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    writes = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    size = int(sys.argv[3]) if len(sys.argv) > 3 else 120
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(connections)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:
        peers = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]

        def drain(conn):
            while conn.recv(65536):
                pass

        readers = [threading.Thread(target=drain, args=(c,)) for c in peers]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        os._exit(0)
    accepted = [listener.accept()[0] for _ in range(connections)]
    for conn in accepted:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = b"x" * size
    before = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(writes):
        accepted[i % connections].send(message)
        if i % connections == connections - 1:
            time.sleep(0.005)
    after = resource.getrusage(resource.RUSAGE_SELF)
    user = (after.ru_utime - before.ru_utime) / writes * 1e6
    system = (after.ru_stime - before.ru_stime) / writes * 1e6
    print(f"{connections} connections, {size}-byte writes: {user + system:.1f} µs CPU per write "
          f"({system:.1f} µs in the kernel, {user:.1f} µs in Python)")
    for conn in accepted:
        conn.close()
    os.waitpid(child, 0)


if __name__ == "__main__":
    main()
