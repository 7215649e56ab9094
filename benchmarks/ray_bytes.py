"""Bytes one document request moves between the router and the replicas of `usg serve --engine ray`.

Starts `usg serve GRAPH --engine ray --no-cache` on 127.0.0.1:PORT, sends one warm-up request of
the sample invoice, then ``--requests`` more (each must read the same lines), and prints the
differences of the router's ``usg_remote_bytes_total{target, direction, transport}`` per request.

Run: python benchmarks/ray_bytes.py [--port 8000] [--requests 3] [--graph PATH] [--image PATH]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
USG = Path(sys.executable).parent / "usg"


def _moved(url: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("usg_remote_bytes_total{"):
            body = line[line.index("{") + 1 : line.index("}")].replace('"', "")
            labels = dict(kv.split("=", 1) for kv in body.split(","))
            out[(labels["target"], labels["direction"], labels["transport"])] = float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", type=Path, default=ROOT / "examples" / "document_ocr" / "graph.yaml")
    ap.add_argument("--image", type=Path, default=ROOT / "examples" / "document_ocr" / "sample.png")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--requests", type=int, default=3)
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    image = args.image.read_bytes()
    log = Path(tempfile.gettempdir()) / f"usg-ray-bytes-{args.port}.log"
    with log.open("wb") as fh:
        cmd = [str(USG), "serve", str(args.graph), "--engine", "ray", "--no-cache", "--port", str(args.port)]
        server = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not become ready; see {log}")
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)

        def lines() -> list[str]:
            files = {"image": (args.image.name, image, "image/png")}
            r = httpx.post(f"{url}/v1/infer", files=files, timeout=300)
            r.raise_for_status()
            return [line["text"] for line in r.json()["outputs"]["lines"]]

        first = lines()
        before = _moved(url)
        for _ in range(args.requests):
            if lines() != first:
                raise SystemExit("a request read different lines than the first")
        after = _moved(url)
        per = {k: (v - before.get(k, 0.0)) / args.requests for k, v in after.items()}
        for (target, direction, transport), v in sorted(per.items()):
            if v > 0:
                print(f"{target:<14} {direction:<8} {transport:<13} {v / 1e6:9.3f} MB")
        for transport in ("object_store", "grpc", "inline"):
            total = sum(v for k, v in per.items() if k[2] == transport)
            print(f"total {transport}: {total / 1e6:.3f} MB per request")
        print(f"{len(first)} lines, the same in every request")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
