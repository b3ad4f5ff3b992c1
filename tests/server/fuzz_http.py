#!/usr/bin/env python3
"""Hostile clients against a running mole serve: every request is a valid
one mutated at random, at the HTTP level (methods, paths, headers,
Content-Length, chunked bodies, bytes flipped, cut off, sent slowly) or in
its JSON (each field given a value of every wrong type and extreme: huge
and negative numbers, NaN, deep nesting, long and invalid strings, control
characters). Python standard library only; deterministic for a seed.

After every request the server must still answer /health; a request it
answers with a 4xx/5xx must carry OpenAI's error shape when the body is
JSON. Prints one summary line; exits 1 on a problem (server gone, an
answer that breaks the rules) with the request that caused it.

usage: fuzz_http.py PORT [--seconds S] [--seed N] [--api-key K]
"""
import argparse
import json
import random
import socket
import sys
import time

VALID = [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4}),
    ("/v1/completions", {"prompt": "A", "max_tokens": 3, "stream": True, "temperature": 0.7, "seed": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief"},
                                           {"role": "user", "content": "Hi"}],
                              "max_tokens": 3, "stream": True, "stop": ["."], "top_k": 5, "min_p": 0.1,
                              "repeat_penalty": 1.1, "logprobs": True, "top_logprobs": 2}),
]
FIELDS = ["prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "stop",
          "seed", "n", "logprobs", "top_logprobs", "stream", "stream_options", "model", "presence_penalty",
          "frequency_penalty", "max_completion_tokens", "user", "zz_unknown"]


def nested(depth, kind):
    s = ("[" * depth + "]" * depth) if kind else ('{"a":' * depth + "1" + "}" * depth)
    return RawJSON(s)


class RawJSON:
    """A JSON fragment written as is (for what json.dumps cannot make)."""

    def __init__(self, text):
        self.text = text


def weird_value(rng):
    pool = [
        None, True, False, 0, -1, 1, 2, 7, -(1 << 31), (1 << 31), (1 << 63), -(1 << 63), (1 << 64), 10 ** 30,
        1e308, -1e308, 5e-324, 0.5, -0.5, 1.5, 3.9, "", "x", "1", "-1", "true", "\u0000", "\ud800", "\uffff",
        "é" * 50, "a" * rng.choice([100, 5000, 70000]), [], [1], ["", "x"], [None], [[]], {}, {"a": 1},
        {"role": "user"}, [{"role": "user", "content": None}], [{"role": "user", "content": ["x"]}],
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [{"role": "assistant", "content": "x"}], [{"role": "user"}], [{"content": "x"}],
        [{"role": "user", "content": "x"}] * 200, ["s"] * 100, ["a" * 3000] * 4,
        RawJSON("NaN"), RawJSON("Infinity"), RawJSON("-Infinity"), RawJSON("1e999"), RawJSON("-0"),
        RawJSON("0x10"), RawJSON("01"), RawJSON('"\\ud800\\udc00"'), RawJSON('"\\uDFFF"'), RawJSON('"\\x"'),
        nested(rng.choice([50, 2000, 100000]), True), nested(rng.choice([50, 2000]), False),
    ]
    return rng.choice(pool)


def to_json(v):
    if isinstance(v, RawJSON):
        return v.text
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + to_json(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(to_json(x) for x in v) + "]"
    return json.dumps(v)


def json_body(rng):
    path, body = rng.choice(VALID)
    body = dict(body)
    for _ in range(rng.randint(1, 3)):
        f = rng.choice(FIELDS)
        if rng.random() < 0.15:
            body.pop(f, None)
        else:
            body[f] = weird_value(rng)
    if rng.random() < 0.05:
        path = "/v1/chat/completions" if path == "/v1/completions" else "/v1/completions"
    if "max_tokens" in body and isinstance(body["max_tokens"], int) and body["max_tokens"] > 64:
        body["max_tokens"] = 64  # keep the good ones short
    text = to_json(body).encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:  # cut off
        text = text[: rng.randrange(len(text) + 1)]
    if rng.random() < 0.1:  # bytes flipped
        b = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        text = bytes(b)
    return path, text


def http_request(rng, key):
    path, body = json_body(rng)
    method = "POST"
    r = rng.random()
    if r < 0.05:
        method = rng.choice(["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW", "get", "P\x00ST"])
    elif r < 0.08:
        path = rng.choice(["/", "/v1", "/v1/", "/v1/models/x", "/health?x=1", "/metrics#", "//v1/completions",
                           "/v1/completions/../completions", "/%00", "/" + "a" * 9000, "*", "/v1/completions?a=%ff"])
    headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Connection", "close")]
    if key:
        headers.append(("Authorization", "Bearer " + key))
    chunked = False
    length = len(body)
    r = rng.random()
    if r < 0.05:
        length = rng.choice([0, 1, length - 1 if length else 0, -1, 1 << 40, "abc", "", " 5", "5, 5"])
    elif r < 0.10:
        chunked = True
    if rng.random() < 0.05:
        headers.append(rng.choice([("Content-Type", "text/plain"), ("X" * 8000, "y"), ("Bad Header", "x"),
                                   ("Authorization", "Bearer " + "k" * 5000), ("Expect", "100-continue"),
                                   ("Connection", "close"), ("Content-Length", "7"), ("Transfer-Encoding", "gzip")]))
    version = "HTTP/1.1" if rng.random() > 0.03 else rng.choice(["HTTP/1.0", "HTTP/2.0", "HTTP/9", "FOO"])
    head = "%s %s %s\r\n" % (method, path, version)
    for k, v in headers:
        head += "%s: %s\r\n" % (k, v)
    if chunked:
        head += "Transfer-Encoding: chunked\r\n\r\n"
        data = b""
        pos = 0
        while pos < len(body):
            n = rng.randint(1, 64)
            size = ("%x" % n) if rng.random() > 0.05 else rng.choice(["zz", "-1", "ffffffffffffffff", ""])
            data += size.encode() + b"\r\n" + body[pos:pos + n] + b"\r\n"
            pos += n
        if rng.random() > 0.1:
            data += b"0\r\n\r\n"
        raw = head.encode("latin-1", "replace") + data
    else:
        head += "Content-Length: %s\r\n\r\n" % (length,)
        raw = head.encode("latin-1", "replace") + body
    return raw


def exchange(port, raw, rng, timeout):
    """Sends raw (sometimes slowly, sometimes closing early); returns the bytes
    answered (None when there are none), False when the server cannot be reached."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return False
    try:
        if rng.random() < 0.05:  # slowly, in small pieces
            for i in range(0, len(raw), 97):
                s.sendall(raw[i:i + 97])
                time.sleep(0.002)
        else:
            s.sendall(raw)
        if rng.random() < 0.05:  # the client goes away
            return None
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                d = s.recv(65536)
            except socket.timeout:
                break
            if not d:
                break
            out += d
            if len(out) > (4 << 20):
                break
        return out
    except (ConnectionError, OSError):
        return None
    finally:
        s.close()


def health(port):
    for _ in range(100):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            out = b""
            while True:
                d = s.recv(4096)
                if not d:
                    break
                out += d
            s.close()
            if out.startswith(b"HTTP/1.1 200") or out.startswith(b"HTTP/1.0 200"):
                return True
            if b" 503 " in out.split(b"\r\n", 1)[0]:  # busy is an answer
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def check_answer(raw, out):
    """None if the answer keeps the rules, else what is wrong."""
    if not out:
        return None  # a connection closed without an answer (bad HTTP) is allowed
    head, _, body = out.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(b" ")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return "not an HTTP answer: %r" % out[:100]
    code = int(parts[1])
    if code >= 500 and code not in (501, 503, 505):  # not implemented, busy, HTTP version: protocol answers
        return "server error %d: %r" % (code, body[:200])
    ctype = [l for l in head.split(b"\r\n")[1:] if l.lower().startswith(b"content-type:")]
    if raw.startswith(b"HEAD "):  # no body to a HEAD
        return None
    if code >= 400 and ctype and b"application/json" in ctype[0] and b"chunked" not in head.lower():
        try:
            d = json.loads(body)
            e = d["error"]
            assert isinstance(e["message"], str) and isinstance(e["type"], str) and "code" in e
        except Exception as ex:  # noqa: BLE001
            return "%d without OpenAI's error shape (%s): %r" % (code, ex, body[:200])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    t_end = time.monotonic() + a.seconds
    n = 0
    codes = {}
    while time.monotonic() < t_end:
        raw = http_request(rng, a.api_key)
        out = exchange(a.port, raw, rng, timeout=5)
        n += 1
        if out is False:
            print("fuzz_http: the server cannot be reached (request %d: %r)" % (n, raw[:600]))
            return 1
        if out:
            st = out.split(b"\r\n", 1)[0].split(b" ")
            c = st[1].decode("latin-1") if len(st) > 1 else "?"
            codes[c] = codes.get(c, 0) + 1
        else:
            codes["none"] = codes.get("none", 0) + 1
        bad = check_answer(raw, out)
        if bad:
            print("fuzz_http: request %d broke a rule: %s\nrequest: %r" % (n, bad, raw[:600]))
            return 1
        if n % 10 == 0 and not health(a.port):
            print("fuzz_http: the server stopped answering after request %d: %r" % (n, raw[:600]))
            return 1
    if not health(a.port):
        print("fuzz_http: the server stopped answering at the end")
        return 1
    print("fuzz_http: %d requests, answers %s" % (n, " ".join("%s:%d" % kv for kv in sorted(codes.items()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
