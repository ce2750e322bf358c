"""Load: 64 concurrent streaming clients on `-np 8` (bounded in count and time). Every
request is answered, each greedy reply equals the same request made alone (so no text is
mixed between requests), and the server's memory stays flat over repeated rounds."""
import asyncio
import json
import os
import time

import aiohttp
import pytest

N_CLIENTS = 64
N_PREDICT = 12
ROUNDS = int(os.environ.get("WGLLM_LOAD_ROUNDS", "6"))
# 16 different requests, each sent by 4 clients at once.
SUBJECTS = ["the sea", "a mountain", "an old clock", "the city at night", "a small robot",
            "winter", "a library", "the moon", "a red bicycle", "bread", "a thunderstorm",
            "the first computer", "a cat on a roof", "jazz music", "a desert road", "tea"]
PROMPTS = [f"Write one sentence about {s}:" for s in SUBJECTS] * 4
assert len(PROMPTS) == N_CLIENTS


async def stream_one(session, url, prompt):
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "stream": True,
            "cache_prompt": False}
    text, tokens, stop = "", [], None
    async with session.post(url + "/completion", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.startswith(b"data: "):
                continue
            d = json.loads(line[6:])
            text += d["content"]
            tokens += d.get("tokens", [])
            if d["stop"]:
                stop = d
    assert stop is not None, "the stream ended without its final message"
    return text, tokens


async def round_of(url, prompts):
    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return await asyncio.gather(*(stream_one(session, url, p) for p in prompts))


def test_64_streaming_clients_on_8_slots(server_factory):
    s = server_factory("-np", "8", "-c", "2048")
    alone = {p: asyncio.run(round_of(s.url, [p]))[0] for p in PROMPTS[:16]}
    assert len({t for t, _ in alone.values()}) == 16, "two requests have the same reply"
    rss = []
    for r in range(ROUNDS):
        t0 = time.time()
        together = asyncio.run(round_of(s.url, PROMPTS))
        print(f"round {r}: {time.time() - t0:.1f} s, rss {s.rss_bytes() >> 20} MiB")
        rss.append(s.rss_bytes())
        for i, (p, b) in enumerate(zip(PROMPTS, together)):
            a = alone[p]
            assert b[1] == a[1], f"client {i}: tokens differ from the same request alone"
            assert b[0] == a[0], f"client {i}: text differs from the same request alone"
    # Flat: after the first rounds have warmed the allocator, the later ones hold no more.
    half = ROUNDS // 2
    growth = rss[-1] - rss[half - 1]
    assert growth < 8 << 20, f"server memory grew {growth >> 20} MiB over rounds {half}..{ROUNDS}: {rss}"


async def first_token_time(session, url, prompt, n_predict, t0):
    """Seconds from t0 to the request's first generated token."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "stream": True}
    async with session.post(url + "/completion", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: ") and json.loads(line[6:]).get("tokens"):
                return time.time() - t0
    raise AssertionError("no token came")


def test_a_short_request_is_answered_while_a_2000_token_prompt_is_processed(server_factory):
    s = server_factory("-np", "2", "-c", "4608", "-b", "64")
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 190

    async def both():
        timeout = aiohttp.ClientTimeout(total=1800)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            t0 = time.time()
            long = asyncio.create_task(first_token_time(session, s.url, long_prompt, 2, t0))
            await asyncio.sleep(2)  # the long prompt is being processed
            short = await first_token_time(session, s.url, "The capital of France is", 2, t0)
            return short, await long

    short, long = asyncio.run(both())
    print(f"short request's first token at {short:.1f} s, the 2000-token prompt's at {long:.1f} s")
    assert short < long
