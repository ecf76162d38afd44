"""A small program profiled by the real pyroscope-io client.

Usage: python pyroscope_hot_app.py SERVER_URL APP_NAME SECONDS [TOKEN]

It spends its time in kiln_hot_function under a dynamic tag, with static
tags, then shuts the profiler down (which uploads what is left).
"""
import sys
import time

import pyroscope


def kiln_hot_function(deadline):
    total = 0
    # CPU time, not wall time: on a busy machine the profile fills later, never thinner.
    while time.process_time() < deadline:
        for i in range(10_000):
            total += i * i
    return total


def main():
    server, app, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    options = dict(
        application_name=app,
        server_address=server,
        sample_rate=100,
        tags={"env": "ci", "team": "kiln"},
    )
    if len(sys.argv) > 4:
        options.update(basic_auth_username="kiln", basic_auth_password=sys.argv[4])
    try:
        pyroscope.configure(upload_interval=2, **options)
    except TypeError:
        # 0.8.x has no upload_interval: it uploads every 10 s.
        pyroscope.configure(**options)
    with pyroscope.tag_wrapper({"endpoint": "/hot"}):
        kiln_hot_function(time.process_time() + seconds)
    pyroscope.shutdown()


if __name__ == "__main__":
    main()
