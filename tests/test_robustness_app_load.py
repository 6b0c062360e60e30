"""The explorer served by `lkat-lens explore` under load: safe defaults, 20 clients x 50 callbacks on loopback.

The server is the real CLI in a child process (debug off, default host). Every request is a real Dash callback
request built from the app's own `/_dash-dependencies`; each answer must equal the answer the idle server gave
to the same request, and the server's resident memory is sampled throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from local_server import free_port

from lkat_lens.apps.explorer import MAX_REQUEST_BYTES

CLIENTS, REQUESTS_PER_CLIENT = 20, 50
MEMORY_GROWTH_LIMIT_MB = 400  # peak RSS under load minus RSS after warm-up
LEAK_LIMIT_MB = 40  # RSS after the second half of the load minus after the first half


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as in /proc/net/tcp*) with a socket listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def post(url: str, body: bytes) -> tuple[int, bytes]:
    """POST JSON; (status, body) for every HTTP status, 2xx or not."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def outputs_of(spec: str) -> list[dict] | dict:
    """Dash's output spec string ("a.prop" or "..a.p...b.q..") as the request's `outputs` field."""
    if not spec.startswith(".."):
        ident, prop = spec.rsplit(".", 1)
        return {"id": ident, "property": prop}
    return [dict(zip(("id", "property"), part.rsplit(".", 1), strict=True)) for part in spec[2:-2].split("...")]


def callback_body(dependency: dict, values: dict[str, object], changed: str) -> bytes:
    """A callback request for one `/_dash-dependencies` entry, component values taken from `values`."""

    def props(items: list[dict]) -> list[dict]:
        return [{"id": i["id"], "property": i["property"], "value": values.get(i["id"])} for i in items]

    body = {
        "output": dependency["output"],
        "outputs": outputs_of(dependency["output"]),
        "inputs": props(dependency["inputs"]),
        "state": props(dependency["state"]),
        "changedPropIds": [changed],
    }
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def server(digits_checkpoint, tmp_path_factory):
    """`lkat-lens explore` on a free port with its defaults; (base url, pid, port); stopped afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "lkat_lens_cli", "explore", str(digits_checkpoint), "--port", str(port)]
    log = tmp_path_factory.mktemp("explorer") / "server.log"  # a file, not a pipe: the request log must not block
    with log.open("w") as sink:
        proc = subprocess.Popen([*command, "--num-images", "12", "--edges", "4"], stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            assert proc.poll() is None, f"explorer exited with {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(url + "/", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "explorer did not start within 180 s"
                time.sleep(0.5)
        yield url, proc.pid, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_server_defaults_are_safe(server):
    """Listens on 127.0.0.1 only, no debug tools, request bodies over the limit refused with 413."""
    url, _, port = server
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else
    with urllib.request.urlopen(url + "/") as response:
        page = response.read().decode()
    config = json.loads(page.split('<script id="_dash-config" type="application/json">')[1].split("</script>")[0])
    assert config["ui"] is False and config["props_check"] is False  # Dash dev tools off, i.e. debug off
    status, _ = post(url + "/_dash-update-component", b"{" + b" " * MAX_REQUEST_BYTES + b"}")
    assert status == 413


def load_requests(url: str) -> list[bytes]:
    """Distinct callback requests: predictions per image, edge and gate figures per block, token views per image."""
    with urllib.request.urlopen(url + "/_dash-dependencies") as response:
        dependencies = {d["output"]: d for d in json.load(response)}

    def find(output_id: str) -> dict:
        return next(d for spec, d in dependencies.items() if f"{output_id}." in spec)

    bodies = []
    for image in range(12):
        bodies.append(callback_body(find("predictions"), {"checkpoint": 0, "image": image}, "image.value"))
        values = {"tabs": "tokens", "checkpoint": 0, "block": image % 4, "image": image}
        bodies.append(callback_body(find("token-norms"), values, "image.value"))
    for block in range(4):
        bodies.append(
            callback_body(find("fc1-curves"), {"tabs": "edges", "checkpoint": 0, "block": block}, "block.value")
        )
        for head in range(2):
            values = {"tabs": "gates", "checkpoint": 0, "block": block, "head": head}
            bodies.append(callback_body(find("gate-heads"), values, "block.value"))
    return bodies


def test_twenty_clients_fifty_requests_each(server):
    """No 5xx, every answer equal to the idle server's, memory bounded and not growing; figures printed."""
    url, pid, _ = server
    endpoint = url + "/_dash-update-component"
    bodies = load_requests(url)
    expected = {}
    for body in bodies:  # warm-up, one at a time: computes and caches every analysis, gives the right answers
        status, answer = post(endpoint, body)
        assert status == 200, answer[:300]
        expected[body] = answer
    warm = rss_mb(pid)
    samples, stop = [warm], threading.Event()

    def sample_memory() -> None:
        while not stop.wait(0.1):
            samples.append(rss_mb(pid))

    def client(seed: int, count: int) -> list[tuple[int, bool, float]]:
        results = []
        for i in range(count):
            body = bodies[(seed * 7 + i) % len(bodies)]
            start = time.perf_counter()
            status, answer = post(endpoint, body)
            results.append((status, answer == expected[body], time.perf_counter() - start))
        return results

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    start = time.perf_counter()
    rounds, rss_after = [], []
    with ThreadPoolExecutor(CLIENTS) as pool:
        for half in range(2):  # two halves of 25 requests per client, to see whether memory keeps growing
            futures = [pool.submit(client, c + half, REQUESTS_PER_CLIENT // 2) for c in range(CLIENTS)]
            rounds += [r for f in futures for r in f.result(timeout=600)]
            rss_after.append(rss_mb(pid))
    elapsed = time.perf_counter() - start
    stop.set()
    sampler.join()
    statuses = sorted({s for s, _, _ in rounds})
    wrong = sum(not ok for _, ok, _ in rounds)
    latencies = sorted(t for _, _, t in rounds)
    print(
        f"\n{len(rounds)} requests from {CLIENTS} clients in {elapsed:.1f} s ({len(rounds) / elapsed:.0f}/s); "
        f"statuses {statuses}; wrong answers {wrong}; latency median {latencies[len(latencies) // 2] * 1e3:.0f} ms, "
        f"p99 {latencies[int(0.99 * len(latencies))] * 1e3:.0f} ms; server RSS warm {warm:.0f} MB, "
        f"peak {max(samples):.0f} MB, after each half {rss_after[0]:.0f} / {rss_after[1]:.0f} MB"
    )
    assert len(rounds) == CLIENTS * REQUESTS_PER_CLIENT
    assert statuses == [200] and wrong == 0
    assert max(samples) - warm < MEMORY_GROWTH_LIMIT_MB
    assert rss_after[1] - rss_after[0] < LEAK_LIMIT_MB
