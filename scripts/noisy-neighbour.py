#!/usr/bin/env python3
"""The noisy-neighbour run behind scripts/noisy-neighbour.sh: ordinary clients stream
greedy chats from a running `wgllm serve`, first alone (quiet), then while one client
sends hostile requests of every class the request budget bounds (replies sized by the
request, bodies that swell when parsed, long runs of letters, copies made by field
selection). Prints the ordinary clients' token latency (p50, p99) quiet and under
attack, their failures, whether their text stayed the same, the hostile requests'
answers, and the server's peak RSS (VmHWM). Exits 1 if an ordinary request failed, a
hostile one got anything but a clean 4xx, or the peak RSS passed the bound given.

Usage: noisy-neighbour.py PORT PID ROUNDS RSS_BOUND_MIB"""
import http.client
import json
import sys
import threading
import time

port, pid, rounds, rss_bound = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
PROMPTS = ["Write a short poem about the sea.", "Name three uses of bread.", "Describe a quiet city at night."]


def post(path, body, headers=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    c.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.read()
    c.close()
    return r.status, out


def chat(prompt):
    """One streamed greedy chat: its text and the gaps between tokens (s)."""
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": 48, "temperature": 0.0}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    text, gaps, last = "", [], None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            raise RuntimeError(f"error event: {ev}")
        for ch in ev.get("choices", []):
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
                text += piece
    c.close()
    return text, gaps


def ordinary(results, stop):
    """Chats until `stop` is set (at least one round of every prompt)."""
    i = 0
    while not stop.is_set() or i < len(PROMPTS):
        p = PROMPTS[i % len(PROMPTS)]
        try:
            text, gaps = chat(p)
            results["gaps"].extend(gaps)
            results["texts"].setdefault(p, set()).add(text)
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            results["failed"].append(repr(e))
        i += 1


def hostile_cases():
    """Each class of hostile request, its body built once beforehand (so that building
    it does not take the machine's cores from the server while it is measured)."""
    big_text = "".join(chr(0x4E00 + (i * 7919) % 20000) + "x!" for i in range(4_000_000))
    cases = [
        ("tokenize 12 MB of mixed text with pieces", "/tokenize",
         {"content": big_text, "with_pieces": True}),
        ("a 42 MB body of zeros as token ids", "/completion",
         '{"prompt": [' + ",".join(["0"] * 21_000_000) + "]}"),
        ("a 30 MB body of empty objects", "/v1/chat/completions",
         '{"messages": [' + ",".join(["{}"] * 10_000_000) + "]}"),
        ("one run of 8 MB of letters", "/tokenize", {"content": "a" * (8 << 20)}),
        ("the most the budget lets through: 5 MB of mixed text with pieces", "/tokenize",
         {"content": big_text[:3_000_000], "with_pieces": True}),
        ("one run of 5 MB of letters", "/tokenize", {"content": "a" * (5 << 20)}),
        ("100 probabilities x 4000 tokens x 64 prompts", "/completion",
         {"prompt": ["Hi"] * 64, "n_predict": 4000, "n_probs": 100}),
        ("detokenize 6 M tokens", "/detokenize", {"tokens": [1000] * 6_000_000}),
        ("response_fields naming one field 100000 times", "/completion",
         {"prompt": "Hi", "n_predict": 2, "response_fields": ["generation_settings"] * 100000}),
        ("a 20 MB chat message", "/apply-template",
         {"messages": [{"role": "user", "content": "word " * (4 << 20)}]}),
    ]
    return [(name, path, body if isinstance(body, str) else json.dumps(body)) for name, path, body in cases]


def hostile(cases):
    """Each hostile request once: (name, status, seconds, first bytes of the answer)."""
    out = []
    for name, path, body in cases:
        t0 = time.monotonic()
        try:
            st, data = post(path, body)
        except Exception as e:  # noqa: BLE001
            st, data = 0, repr(e).encode()
        out.append((name, st, time.monotonic() - t0, data[:160].decode(errors="replace")))
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def run_phase(attack, cases=None):
    res = {"gaps": [], "texts": {}, "failed": []}
    stop = threading.Event()
    clients = [threading.Thread(target=ordinary, args=(res, stop)) for _ in range(2)]
    for c in clients:
        c.start()
    answers = []
    if attack:
        for _ in range(rounds):
            answers.extend(hostile(cases))
    else:
        time.sleep(20 * rounds)
    stop.set()
    for c in clients:
        c.join()
    return res, answers


def vm_hwm_mib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


cases = hostile_cases()
quiet, _ = run_phase(False)
rss_quiet = vm_hwm_mib()
loud, answers = run_phase(True, cases)
rss_peak = vm_hwm_mib()
bad = []
print("| hostile request | status | seconds | answer |")
print("|---|---:|---:|---|")
for name, st, secs, text in answers:
    print(f"| {name} | {st} | {secs:.2f} | {text[:100]} |")
    if not (400 <= st < 500 or st == 200):
        bad.append(f"{name}: {st}")
print()
print("| ordinary clients | replies | failed | p50 ms/token | p99 ms/token |")
print("|---|---:|---:|---:|---:|")
for label, r in (("quiet", quiet), ("under attack", loud)):
    n = sum(len(v) for v in r["texts"].values())
    print(f"| {label} | {len(r['gaps'])} gaps | {len(r['failed'])} | {pct(r['gaps'], 0.5):.1f} | {pct(r['gaps'], 0.99):.1f} |")
same = all(quiet["texts"].get(p) == loud["texts"].get(p) for p in PROMPTS)
print(f"\nthe ordinary replies' text was the same quiet and under attack: {same}")
print(f"peak RSS: {rss_quiet:.0f} MiB after the quiet run, {rss_peak:.0f} MiB after the attack (bound {rss_bound} MiB)")
if loud["failed"] or quiet["failed"]:
    bad.append(f"ordinary requests failed: {quiet['failed'] + loud['failed']}")
if rss_peak > rss_bound:
    bad.append(f"peak RSS {rss_peak:.0f} MiB over {rss_bound} MiB")
if bad:
    print("FAILED:", *bad, sep="\n  ")
    sys.exit(1)
