"""A logging TCP relay for capturing RTSP exchanges as test fixtures.

Usage: rtsp-tap.py LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT OUT_PREFIX SECONDS
Relays one connection at a time between 127.0.0.1:LISTEN_PORT and the upstream, and writes
what each side sent, byte for byte, to OUT_PREFIX-client.txt and OUT_PREFIX-server.txt.
Stops after SECONDS.
"""
import selectors
import socket
import sys
import time

port, host, uport, prefix, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
end = time.time() + min(seconds, 600.0)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(4)
ls.settimeout(1.0)
with open(prefix + "-client.txt", "wb") as to_server_log, open(prefix + "-server.txt", "wb") as to_client_log:
    while time.time() < end:
        try:
            c, _ = ls.accept()
        except socket.timeout:
            continue
        u = socket.create_connection((host, uport))
        sel = selectors.DefaultSelector()
        sel.register(c, selectors.EVENT_READ, (u, to_server_log))
        sel.register(u, selectors.EVENT_READ, (c, to_client_log))
        alive = True
        while alive and time.time() < end:
            for key, _ in sel.select(timeout=0.5):
                other, log = key.data
                data = key.fileobj.recv(65536)
                if not data:
                    alive = False
                    break
                log.write(data)
                log.flush()
                other.sendall(data)
        c.close()
        u.close()
