"""Profiles itself with the real pyroscope-io 1.x client, CPU and memory on.

Usage: python pyroscope_push_app.py SERVER_URL APP_NAME SECONDS

kiln-api's test listens at SERVER_URL and keeps the Push bodies it gets.
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


def main():
    server, app, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pyroscope.configure(
        application_name=app,
        server_address=server,
        sample_rate=100,
        upload_interval=1,
        mem_enabled=True,
        tags={"env": "ci"},
    )
    spin(time.process_time() + seconds)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
