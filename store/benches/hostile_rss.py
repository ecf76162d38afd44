"""Peak RSS (VmHWM) of a fresh kiln-store after one of the hostile
requests of issue 15, for the before/after numbers in
docs/benchmarks/log/2026-11-25-store-hostile-requests.md.

usage: python3 store/benches/hostile_rss.py <kiln-store binary> <r2|r3>

r2: one pprof sample with 16M empty labels (32 KB gzip) to /ingest.
r3: a Go-style multipart upload whose profile and prev_profile hold ten
    samples of 4096 frames of one function with a 60 KB name (914 B).
Standard library only; the store runs on a temp dir and is killed after.
"""
import gzip, http.client, os, socket, subprocess, sys, tempfile, time

def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7f) | 0x80); n >>= 7
    out.append(n); return bytes(out)

def field(num, wt, payload):
    key = varint((num << 3) | wt)
    if wt == 2: return key + varint(len(payload)) + payload
    return key + payload

def r2(labels=16 << 20):
    sample = b"\x10\x01" + b"\x1a\x00" * labels
    plain = b"\x0a\x04\x08\x01\x10\x02" + field(2, 2, sample)
    for s in [b"", b"cpu", b"ns"]: plain += field(6, 2, s)
    return gzip.compress(plain, 9)

def r3_profile(alloc):
    strings = [b"", b"alloc_space", b"bytes", b"inuse_space", b"num", b"n" * 60000]
    p = field(1, 2, field(1, 0, varint(1)) + field(2, 0, varint(2)))
    p += field(1, 2, field(1, 0, varint(3)) + field(2, 0, varint(2)))
    for num in range(10):
        s = field(1, 2, varint(1) * 4096)                       # packed location ids
        s += field(2, 2, varint(alloc + num) + varint(1))        # values
        s += field(3, 2, field(1, 0, varint(4)) + field(3, 0, varint(num)))
        p += field(2, 2, s)
    p += field(4, 2, field(1, 0, varint(1)) + field(3, 0, varint(16)) + field(4, 2, field(1, 0, varint(1)) + field(2, 0, varint(3))))
    p += field(5, 2, field(1, 0, varint(1)) + field(2, 0, varint(5)))
    for s in strings: p += field(6, 2, s)
    return gzip.compress(p, 9)

def multipart(parts):
    body = b""
    for name, content in parts:
        body += (f'--BOUNDARY\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.pprof"\r\n'
                 'Content-Type: application/octet-stream\r\n\r\n').encode() + content + b"\r\n"
    return body + b"--BOUNDARY--\r\n"

def hwm(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"): return int(line.split()[1]) // 1024

def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("r2", "r3"):
        sys.exit(__doc__)
    binary, case = sys.argv[1], sys.argv[2]
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    data = tempfile.mkdtemp(prefix="kiln-hostile-")
    proc = subprocess.Popen([binary, f"--listen=127.0.0.1:{port}", f"--data-dir={data}"],
                            env={**os.environ, "KILN_LOG": "error"}, stdout=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/readyz")
                if c.getresponse().status == 200: break
            except OSError: pass
            time.sleep(0.1)
        before = hwm(proc.pid)
        if case == "r2":
            path, headers, body = "/ingest?name=bomb&format=pprof", {}, r2()
        else:
            path = "/ingest?name=deep&spyName=gospy"
            headers = {"Content-Type": "multipart/form-data; boundary=BOUNDARY"}
            body = multipart([("profile", r3_profile(1000)), ("prev_profile", r3_profile(600))])
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        started = time.time()
        c.request("POST", path, body=body, headers=headers)
        r = c.getresponse(); text = r.read()[:160]
        print(f"{case}: body {len(body)} B -> {r.status} in {time.time()-started:.1f}s {text!r}; VmHWM {before} -> {hwm(proc.pid)} MiB")
    finally:
        proc.kill(); proc.wait()

if __name__ == "__main__":
    main()
