#!/usr/bin/env python3
"""A bounded load on an OpenAI-compatible server: N concurrent streams, each
sending R streaming /v1/completions requests one after another. Prints one
JSON line: aggregate generated tokens/s, p50/p99 time to first token and
inter-token latency, and (for mole serve) expert bytes read per generated
token from /metrics. Python standard library only.

--prompt-chars N pads each prompt with words to N characters (long prompts:
a bounded KV cache's load), and mole's KV gauges from /metrics are added.

usage: serve_load.py URL STREAMS [--requests R] [--max-tokens N] [--prompt-chars N] [--api-key K]
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


WORDS = ("river stone light market winter garden letter silver engine forest window harbor candle "
         "mountain paper thunder orchard lantern meadow copper bridge valley whisper compass").split()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def metrics(url, key):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    h = {"Authorization": "Bearer " + key} if key else {}
    try:
        c.request("GET", "/metrics", headers=h)
        r = c.getresponse()
        text = r.read().decode() if r.status == 200 else ""
    except OSError:
        text = ""
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, val = line.rpartition(" ")
            try:
                out[name] = float(val)
            except ValueError:
                pass
    return out


def one_request(url, key, prompt, max_tokens, seed, rec):
    u = urllib.parse.urlparse(url)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, "seed": seed,
                       "temperature": 0.8, "stream_options": {"include_usage": True}})
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body=body, headers=h)
    r = c.getresponse()
    if r.status != 200:
        rec["errors"] += 1
        sys.stderr.write("serve_load: HTTP %d: %s\n" % (r.status, r.read()[:300].decode("utf-8", "replace")))
        c.close()
        return
    last = None
    tokens = 0
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            tokens = d["usage"]["completion_tokens"]
        ch = d.get("choices") or []
        if ch and ch[0].get("text"):
            now = time.monotonic()
            if last is None:
                rec["ttft"].append(now - t0)
            else:
                rec["itl"].append(now - last)
            last = now
    c.close()
    rec["tokens"] += tokens
    rec["requests"] += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("streams", type=int)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-chars", type=int, default=0)
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    recs = [{"ttft": [], "itl": [], "tokens": 0, "requests": 0, "errors": 0} for _ in range(a.streams)]
    m0 = metrics(a.url, a.api_key)

    def stream(i):
        for j in range(a.requests):
            prompt = "Request %d of stream %d: tell a long story about the number %d." % (j, i, 1000 * i + j)
            words, k = [], 0
            while len(prompt) + sum(len(w) + 1 for w in words) < a.prompt_chars:
                words.append(WORDS[(7 * i + 13 * j + 31 * k + k * k) % len(WORDS)])
                k += 1
            prompt = (prompt + " " + " ".join(words))[:max(a.prompt_chars, len(prompt))]
            one_request(a.url, a.api_key, prompt, a.max_tokens, 1000 * i + j, recs[i])

    t0 = time.monotonic()
    th = [threading.Thread(target=stream, args=(i,)) for i in range(a.streams)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    m1 = metrics(a.url, a.api_key)
    ttft = [x for r in recs for x in r["ttft"]]
    itl = [x for r in recs for x in r["itl"]]
    tokens = sum(r["tokens"] for r in recs)
    out = {"streams": a.streams, "requests": sum(r["requests"] for r in recs),
           "errors": sum(r["errors"] for r in recs), "tokens": tokens, "wall_s": round(wall, 3),
           "tps": round(tokens / wall, 2) if wall > 0 else 0,
           "ttft_p50_ms": round(1000 * percentile(ttft, 50), 1), "ttft_p99_ms": round(1000 * percentile(ttft, 99), 1),
           "itl_p50_ms": round(1000 * percentile(itl, 50), 2), "itl_p99_ms": round(1000 * percentile(itl, 99), 2)}
    key_b, key_g = "mole_expert_bytes_read_total", "mole_generated_tokens_total"
    if key_b in m1 and key_g in m1 and m1[key_g] > m0.get(key_g, 0):
        out["bytes_per_token"] = round((m1[key_b] - m0.get(key_b, 0)) / (m1[key_g] - m0.get(key_g, 0)))
    for k in ("mole_kv_bytes", "mole_kv_entries"):
        if k in m1:
            out[k[5:]] = int(m1[k])
    if "mole_kv_evicted_total" in m1:
        out["kv_evicted"] = int(m1["mole_kv_evicted_total"] - m0.get("mole_kv_evicted_total", 0))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
