"""Profiles itself with the real pyroscope-io client, for a capture.

Usage: python pyroscope_capture_app.py SERVER_URL APP_NAME SECONDS

kiln-store's captured_clients test listens at SERVER_URL, keeps every
request byte for byte, and replays them against a real kiln-store. The
time goes to kiln_capture_a and kiln_capture_b under two values of a
dynamic tag, with static tags; 1.x also profiles memory.
"""
import sys
import time

import pyroscope


def spin(deadline):
    total = 0
    # CPU time, not wall time: on a busy machine the profile fills later, never thinner.
    while time.process_time() < deadline:
        for i in range(10_000):
            total += i * i
    return total


def kiln_capture_a(deadline):
    return spin(deadline)


def kiln_capture_b(deadline):
    return spin(deadline)


def main():
    server, app, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    options = dict(
        application_name=app,
        server_address=server,
        sample_rate=100,
        tags={"env": "ci"},
    )
    try:
        pyroscope.configure(upload_interval=1, mem_enabled=True, **options)
    except TypeError:
        # 0.8.x has neither: it uploads every 10 s (and at shutdown) and
        # profiles CPU only.
        pyroscope.configure(**options)
    half = seconds / 2
    with pyroscope.tag_wrapper({"endpoint": "/a"}):
        kiln_capture_a(time.process_time() + half)
    with pyroscope.tag_wrapper({"endpoint": "/b"}):
        kiln_capture_b(time.process_time() + half)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
