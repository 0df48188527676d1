"""The live555 RTSP proxy (liblivemedia from PyPI), for the interop tests and `fanout bench rtsp`.

Usage: live555-proxy.py PORT UPSTREAM_URL SECONDS
Serves UPSTREAM_URL as rtsp://127.0.0.1:PORT/cam for SECONDS (bounded), then stops.
"""
import sys
import time

import liblivemedia

port, upstream, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
proxy = liblivemedia.ProxyServer("127.0.0.1", port)
proxy.addURI(upstream, "cam", "", "")
proxy.start()
print(f"live555 proxy: rtsp://127.0.0.1:{port}/cam -> {upstream}", flush=True)
time.sleep(min(seconds, 3600.0))
proxy.stop()
