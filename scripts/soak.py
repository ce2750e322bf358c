#!/usr/bin/env python3
"""The soak run behind scripts/soak.sh: drives a running `wgllm serve` (-np 4, small
context, --context-shift, --slot-save-path, --metrics) with four clients, one per slot,
until TOKENS tokens were generated, sampling the server's RSS, the GPU memory its
buffers hold (`wgllm:gpu_buffer_bytes`) and the host prompt cache's bytes
(`wgllm:prompt_cache_bytes`) every INTERVAL seconds. Each client holds a
streamed chat that grows turn by turn (the slot's cache reused as the prompt's prefix),
with long answers that run into the slot's context end (shifts), a slot save and
restore every few turns, and every seventh request cancelled by hanging up mid-stream.

Prints the curve and fails if a request other than a cancelled one failed, or if RSS
less the prompt cache or GPU memory grew after warm-up (the last third's peak above the middle third's)."""
import http.client
import json
import os
import sys
import threading
import time

port, pid, tokens_wanted, interval = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
lock = threading.Lock()
state = {"tokens": 0, "requests": 0, "cancelled": 0, "failed": 0, "saves": 0, "shifts": 0}
failures = []
stop = threading.Event()
TOPICS = ["the sea", "a city at night", "an old clock", "winter birds", "a long train ride", "bread"]


def request(method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def fail(what):
    with lock:
        state["failed"] += 1
        failures.append(what)
    print("FAILED:", what, file=sys.stderr, flush=True)


def chat_turn(slot, history, cancel):
    body = {"messages": history, "stream": True, "id_slot": slot, "cache_prompt": True,
            "max_tokens": 300 if len(history) % 4 == 1 else 80, "temperature": 0.8,
            "seed": len(history), "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        fail(f"slot {slot}: chat answered {r.status}: {r.read()[:300]!r}")
        c.close()
        stop.set()  # a client's mistake or the server's: either way the soak is over
        return None
    text, n_events, usage = [], 0, None
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            break
        ev = json.loads(line[6:])
        if "error" in ev:
            fail(f"slot {slot}: stream error {ev['error']}")
            break
        n_events += 1
        for ch in ev.get("choices", []):
            text.append(ch.get("delta", {}).get("content") or "")
        if ev.get("usage"):
            usage = ev["usage"]
        if cancel and n_events >= 5:
            c.close()  # hang up mid-stream: the server cancels the request
            with lock:
                state["cancelled"] += 1
                state["tokens"] += n_events
            return None
    c.close()
    if usage is None:
        fail(f"slot {slot}: a stream without usage")
        return None
    with lock:
        state["tokens"] += usage["completion_tokens"]
        state["requests"] += 1
    return "".join(text), usage["prompt_tokens"] + usage["completion_tokens"]


def client(slot):
    history, turn, used = [], 0, 0
    while not stop.is_set():
        # A new conversation once this one fills most of the slot's 512 cells (a prompt
        # longer than the slot is refused, as llama-server refuses it); until then each
        # turn's prompt starts with the slot's cached conversation.
        if used > 320:
            history, used = [], 0
        history.append({"role": "user", "content": f"Tell me about {TOPICS[(slot + turn) % len(TOPICS)]}, at length."})
        cancel = turn % 7 == 6
        got = chat_turn(slot, history, cancel)
        turn += 1
        if got is None:
            history.pop()
        else:
            reply, used = got
            history.append({"role": "assistant", "content": reply})
        if turn % 5 == 0 and not stop.is_set():
            name = f"soak-{slot}.bin"
            for action in ["save", "restore"]:
                st, data = request("POST", f"/slots/{slot}?action={action}", {"filename": name})
                if st != 200:
                    fail(f"slot {slot}: {action} answered {st}: {data[:300]!r}")
            with lock:
                state["saves"] += 1
        with lock:
            if state["tokens"] >= tokens_wanted:
                stop.set()


def sample():
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    gpu = cache = 0
    st, data = request("GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith("wgllm:gpu_buffer_bytes"):
            gpu = float(line.split()[1])
        if line.startswith("wgllm:prompt_cache_bytes"):
            cache = float(line.split()[1])
    return rss, gpu, cache


def main():
    t0 = time.time()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    curve = []
    print(f"{'minute':>7} {'tokens':>8} {'requests':>8} {'RSS MiB':>8} {'GPU MiB':>8} "
          f"{'cache MiB':>9} {'RSS-cache':>9}", flush=True)
    while True:
        done = stop.wait(interval)
        rss, gpu, cache = sample()
        with lock:
            row = (time.time() - t0, state["tokens"], state["requests"], rss, gpu, rss - cache)
        curve.append(row)
        print(f"{row[0] / 60:7.1f} {row[1]:8d} {row[2]:8d} {rss / 2**20:8.1f} {gpu / 2**20:8.1f} "
              f"{cache / 2**20:9.1f} {(rss - cache) / 2**20:9.1f}", flush=True)
        if done:
            break
    for t in threads:
        t.join(timeout=900)
    with lock:
        s = dict(state)
    print(f"{s['tokens']} tokens, {s['requests']} requests answered, {s['cancelled']} cancelled, "
          f"{s['saves']} slot save/restore pairs, {s['failed']} failed; "
          f"{(time.time() - t0) / 60:.1f} minutes", flush=True)
    ok = s["failed"] == 0
    # After warm-up (the first third of the samples), a leak raises the later peaks: the
    # last third's highest sample against the middle third's, with room for the
    # allocator's noise (2 % or 16 MiB of RSS; 1 % or 4 MiB of GPU buffers, where
    # readback and staging buffers come and go between steps). RSS counts without the
    # prompt cache's snapshots, which fill up to --cache-ram by design.
    third = max(len(curve) // 3, 1)
    middle, last = curve[third:2 * third] or curve, curve[2 * third:] or curve
    for what, col, frac, slack in [("RSS less the prompt cache", 5, 0.02, 16),
                                   ("GPU buffers", 4, 0.01, 4)]:
        before, after = max(r[col] for r in middle), max(r[col] for r in last)
        if after > before + max(frac * before, slack * 2**20):
            print(f"{what} grew after warm-up: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB")
            ok = False
    for f in failures[:10]:
        print("failure:", f)
    print("soak: " + ("flat" if ok else "FAILED"))
    return 0 if ok else 1


sys.exit(main())
