"""What the record-*-ref.py scripts share: llama-server from the CPU build of
../shared/tools/llamacpp-ref (LLAMACPP_REF, default ~/.cache/llamacpp-ref) started on a
free 127.0.0.1 port, and JSON requests to it."""
import json, os, socket, subprocess, time, urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def start(args):
    """llama-server with `args` (after the binary), once it answers /health: (process, port)."""
    ref = os.environ.get("LLAMACPP_REF", os.path.expanduser("~/.cache/llamacpp-ref"))
    server = os.path.join(ref, "bin", "llama-server")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(ref, "bin"))
    port = free_port()
    p = subprocess.Popen([server, *args, "--host", "127.0.0.1", "--port", str(port)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except Exception:
            time.sleep(0.2)
    return p, port
