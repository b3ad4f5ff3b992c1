#!/usr/bin/env python3
"""Soak test of mole serve: for a few minutes, clients do random things at
once (good chat and completion requests, streaming and not; malformed JSON;
wrong types; huge bodies; disconnects mid-stream; half-sent requests; the
hostile requests of tests/server/fuzz_http.py), while
the server's RSS is sampled. Passes when the server never dies, every good
request gets a valid 200 answer, every bad one a 4xx JSON error, and RSS
after the warm-up stays flat (growth under 10%).

usage: serve_soak.py MOLE MODEL [--seconds 180] [--clients 6] [--serve-args "--kv-budget 32 ..."]
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))
import fuzz_http  # noqa: E402  (the hostile requests of the server test)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mole")
    ap.add_argument("model")
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--serve-args", default="", help="more mole serve flags, e.g. a KV budget or offloading")
    a = ap.parse_args()
    srv = subprocess.Popen([a.mole, "serve", "-m", a.model, "-t", "2", "--port", "0", "--parallel", "4",
                            "--max-queue", "8", "-c", "512", "--max-tokens", "48", "--timeout", "2"] + a.serve_args.split(),
                           stderr=subprocess.PIPE, text=True)
    port = None
    for line in srv.stderr:
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        print("server did not start")
        return 1
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
    stats = {"good": 0, "good_ok": 0, "busy": 0, "bad": 0, "bad_4xx": 0, "disconnects": 0, "stalls": 0, "fuzz": 0,
             "problems": []}
    lock = threading.Lock()
    stop = time.monotonic() + a.seconds

    def note(k, v=1):
        with lock:
            stats[k] += v

    def problem(msg):
        with lock:
            if len(stats["problems"]) < 20:
                stats["problems"].append(msg)

    def good(rng):
        chat = rng.random() < 0.5
        stream = rng.random() < 0.5
        body = {"max_tokens": rng.randint(1, 48), "stream": stream, "seed": rng.randint(0, 1 << 30)}
        if chat:
            body["messages"] = [{"role": "user", "content": "hello %d" % rng.randint(0, 99)}]
        else:
            body["prompt"] = "story %d" % rng.randint(0, 99)
        if rng.random() < 0.3:
            body["stop"] = ["e"]
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        note("good")
        if r.status == 503:  # a full queue is a valid answer under this load
            note("busy")
            return
        if r.status != 200:
            problem("good request got %d: %s" % (r.status, data[:200]))
            return
        if stream:
            lines = [l for l in data.decode().split("\n") if l.startswith("data: ")]
            if not lines or lines[-1] != "data: [DONE]":
                problem("stream without [DONE]")
                return
            for l in lines[:-1]:
                json.loads(l[6:])
        else:
            json.loads(data)
        note("good_ok")

    def bad(rng):
        kind = rng.randrange(4)
        bodies = [b"{not json", b'{"prompt": 7}', b'{"messages": [{"role": "x", "content": 1}]}',
                  b'{"prompt": "' + b"a" * (5 << 20) + b'"}']
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("POST", "/v1/completions" if kind != 2 else "/v1/chat/completions", bodies[kind],
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        except (ConnectionError, OSError):  # a huge body may be cut off after the 413
            note("bad")
            note("bad_4xx")
            return
        finally:
            c.close()
        note("bad")
        if 400 <= r.status < 500 and "error" in json.loads(data):
            note("bad_4xx")
        else:
            problem("bad request got %d" % r.status)

    def disconnect(rng):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        body = json.dumps({"prompt": "go", "max_tokens": 48, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(rng.uniform(0, 0.3))
        s.close()
        note("disconnects")

    def stall(rng):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        time.sleep(rng.uniform(0, 3))
        s.close()
        note("stalls")

    def fuzz(rng):  # a valid request mutated at random (HTTP or JSON): any answer but a broken one
        raw = fuzz_http.http_request(rng, "")
        out = fuzz_http.exchange(port, raw, rng, timeout=10)
        note("fuzz")
        why = "the server cannot be reached" if out is False else fuzz_http.check_answer(raw, out or b"")
        if why:
            problem("fuzz: %s: %r" % (why, raw[:200]))

    def client(i):
        rng = random.Random(i)
        while time.monotonic() < stop:
            f = rng.choices([good, bad, disconnect, stall, fuzz], [6, 2, 1, 1, 2])[0]
            try:
                f(rng)
            except Exception as e:  # noqa: BLE001 - any client-side failure is a finding
                problem("%s: %r" % (f.__name__, e))

    rss = []
    th = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in th:
        t.start()
    t0 = time.monotonic()
    while any(t.is_alive() for t in th):
        if srv.poll() is not None:
            problem("the server died with code %s" % srv.returncode)
            break
        rss.append((time.monotonic() - t0, rss_kib(srv.pid)))
        time.sleep(2)
    for t in th:
        t.join()
    alive = srv.poll() is None
    srv.send_signal(2)
    code = srv.wait(timeout=60)
    warm = [r for t, r in rss if t > min(30, a.seconds / 3)]
    growth = (warm[-1] - warm[0]) / warm[0] if len(warm) > 1 and warm[0] else 0.0
    out = dict(stats, seconds=a.seconds, alive=alive, exit_code=code,
               rss_mib_start=round(warm[0] / 1024, 1) if warm else None,
               rss_mib_end=round(warm[-1] / 1024, 1) if warm else None, rss_growth=round(growth, 4))
    print(json.dumps(out, indent=1))
    ok = (alive and code == 0 and not stats["problems"] and stats["good_ok"] + stats["busy"] == stats["good"]
          and stats["bad_4xx"] == stats["bad"] and growth < 0.10)
    print("soak: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
