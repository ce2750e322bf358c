"""Fixtures for the client tests: `wgllm serve` on SmolLM2, listening on 127.0.0.1 only.

Run by scripts/server-tests.sh (the suite's Python environment, which has the `openai`
and `aiohttp` packages): WGLLM_SUITE_SERVER is the wgllm binary, WGLLM_SUITE_MODEL the
model file.
"""
import os
import socket
import subprocess
import time
import urllib.request

import pytest


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [os.environ["WGLLM_SUITE_SERVER"], "serve", "-m", os.environ["WGLLM_SUITE_MODEL"],
               "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"wgllm serve exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("wgllm serve did not become healthy in 300 s")
            time.sleep(0.2)

    def rss_bytes(self):
        """The server's resident memory."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server_factory():
    started = []

    def start(*args):
        s = Server(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
