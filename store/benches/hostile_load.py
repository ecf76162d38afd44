"""A well-behaved client's latency and the store's peak RSS (VmHWM) while
one of issue 15's floods runs, for the before/after numbers in
docs/benchmarks/log/2026-11-25-store-hostile-requests.md.

usage: python3 store/benches/hostile_load.py <kiln-store binary> <r4|r6|r8> [flags...]

r4: 300 connections each holding a partial request head (slowloris), then
    20 good ingests and queries while they are open; reports whether the
    store closed them and how many are still open after --header-read-timeout.
    Then 256 ingests whose bodies trickle, and one good ingest and query.
r8: 40 blocks (one per flush), then 256 concurrent flame graph queries with
    a heavy `=~` pattern, with a good ingest from curl (another process, so
    this script's own threads do not slow it) and good ingests meanwhile.
r6: 2,000 profiles, each a new series in one namespace, 8 at a time, then a
    profile into an existing series.
Extra flags go to kiln-store. Standard library only; the store runs on a
temp dir and is killed after. Loops are bounded in count and time.
"""
import http.client, os, socket, subprocess, sys, tempfile, threading, time, urllib.parse

HEAVY = r"(\w{1,4}){1,5}"

def hwm(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024

def request(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.time()
    try:
        c.request(method, path, body=body)
        r = c.getresponse()
        text = r.read()
        return r.status, text, time.time() - started
    except OSError as e:
        return None, str(e).encode(), time.time() - started
    finally:
        c.close()

def now():
    return int(time.time())

def good_ingest(port, name="good.cpu"):
    return request(port, "POST", f"/ingest?name={name}&format=folded&from={now()-10}&until={now()}", b"main;work 7\n")

def good_query(port):
    q = urllib.parse.quote('process_cpu{service_name="good"}')
    return request(port, "GET", f"/api/v1/flamegraph?query={q}&from=now-1h")

def good_client(port, rounds):
    times = []
    for _ in range(rounds):
        si, _, ti = good_ingest(port)
        sq, _, tq = good_query(port)
        times.append((si, ti, sq, tq))
    ok = sum(1 for si, _, sq, _ in times if si == 200 and sq == 200)
    worst_i = max(t for _, t, _, _ in times) * 1000
    worst_q = max(t for _, _, _, t in times) * 1000
    return f"good client: {ok}/{rounds} ingest+query OK, slowest ingest {worst_i:.0f} ms, slowest query {worst_q:.0f} ms"

def r4(port, pid):
    held = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /ingest?name=slow.cpu HTTP/1.1\r\nHost: x\r\n")
        held.append(s)
    time.sleep(1)
    print("during 300 slowloris connections:", good_client(port, 20), f"VmHWM {hwm(pid)} MiB")
    deadline = time.time() + 40
    while time.time() < deadline:
        time.sleep(1)
        open_ = 0
        for s in held:
            s.settimeout(0.01)
            try:
                if s.recv(1) != b"":
                    open_ += 1
            except socket.timeout:
                open_ += 1
            except OSError:
                pass
        if open_ == 0:
            break
    print(f"slowloris connections still open after {time.time() - deadline + 40:.0f} s: {open_}/300")
    for s in held:
        s.close()
    print("after:", good_client(port, 20), f"VmHWM {hwm(pid)} MiB")
    # 256 ingests whose bodies trickle (as many as --max-inflight's default).
    slow = []
    for _ in range(256):
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.sendall(b"POST /ingest?name=slow.cpu&format=folded HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nmain 1")
        slow.append(c)
    time.sleep(1)
    si = good_ingest(port)[0]
    sq = good_query(port)[0]
    print(f"during 256 slow ingest bodies: good ingest {si}, good query {sq}")
    for c in slow:
        c.close()

def r8(port, pid):
    for i in range(40):
        request(port, "POST", f"/ingest?name=app.cpu{{pod=pod-{i}}}&format=folded&from={now()-10}&until={now()}", b"main;work 1\n")
        time.sleep(1.1)
    q = urllib.parse.quote('process_cpu{pod=~"%s"}' % HEAVY.replace('\\', '\\\\'))
    status, text, took = request(port, "GET", f"/api/v1/flamegraph?query={q}&from=now-1h")
    print(f"one heavy query alone: {status} in {took*1000:.0f} ms {text[:100]!r}")
    results = []
    def one():
        results.append(request(port, "GET", f"/api/v1/flamegraph?query={q}&from=now-1h", timeout=120))
    threads = [threading.Thread(target=one) for _ in range(256)]
    started = time.time()
    for t in threads: t.start()
    # A good ingest from another process: this one's 256 threads slow its
    # own client (the GIL) by seconds.
    curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}\n",
                           "--data-binary", "main;work 7", f"http://127.0.0.1:{port}/ingest?name=good.cpu&format=folded"],
                          capture_output=True, text=True).stdout.strip()
    during = f"curl ingest: {curl} s; " + good_client(port, 5)
    for t in threads: t.join()
    statuses = {}
    for s, _, _ in results:
        statuses[s] = statuses.get(s, 0) + 1
    slowest = max(t for _, _, t in results)
    print(f"256 heavy queries: {statuses} in {time.time()-started:.1f} s (slowest {slowest:.1f} s); during: {during}; VmHWM {hwm(pid)} MiB")

def r6(port, pid):
    results = []
    def burst(k):
        for i in range(250):
            s, t, _ = request(port, "POST", f"/ingest?name=app.cpu{{namespace=churn,pod=p{k}-{i}}}&format=folded&from={now()-10}&until={now()}", b"main;work 1\n")
            results.append((s, t))
    threads = [threading.Thread(target=burst, args=(k,)) for k in range(8)]
    started = time.time()
    for t in threads: t.start()
    for t in threads: t.join()
    statuses = {}
    for s, _ in results:
        statuses[s] = statuses.get(s, 0) + 1
    print(f"2000 new series in namespace churn: {statuses} in {time.time()-started:.1f} s; VmHWM {hwm(pid)} MiB")
    print("existing series:", request(port, "POST", f"/ingest?name=app.cpu{{namespace=churn,pod=p0-0}}&format=folded&from={now()-10}&until={now()}", b"main;work 1\n")[:2])
    print("other namespace, new series:", request(port, "POST", f"/ingest?name=app.cpu{{namespace=quiet,pod=a}}&format=folded&from={now()-10}&until={now()}", b"main;work 1\n")[:2])
    print("after:", good_client(port, 5))

def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("r4", "r6", "r8"):
        sys.exit(__doc__)
    binary, case, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    data = tempfile.mkdtemp(prefix="kiln-hostile-")
    if case == "r8":
        extra = ["--flush-interval=1s"] + extra
    proc = subprocess.Popen([binary, f"--listen=127.0.0.1:{port}", f"--data-dir={data}", *extra],
                            env={**os.environ, "KILN_LOG": "error"}, stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if request(port, "GET", "/readyz", timeout=2)[0] == 200:
                break
            time.sleep(0.1)
        good_ingest(port)
        print(f"{case}: ready, VmHWM {hwm(proc.pid)} MiB")
        {"r4": r4, "r6": r6, "r8": r8}[case](port, proc.pid)
    finally:
        proc.kill(); proc.wait()

if __name__ == "__main__":
    main()
