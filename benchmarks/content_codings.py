"""What each Content-Encoding of the Collector's otlphttp exporter costs serve on Envoy's spans: the compressed
size, and the time to decompress (receiver/content_coding.py, with its limit and in-flight reservation), as a
ratio to the baseline measured in the same run on the same body: the fast path's decode of the plain body, bytes
to a batch, which every request pays whatever its coding.

    .venv/bin/python benchmarks/content_codings.py [--per-request 1000] [--requests 100]
"""

from __future__ import annotations

import argparse
import gzip
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cramjam  # noqa: E402
import lz4.frame  # noqa: E402

from sloscope.receiver.content_coding import decode  # noqa: E402
from sloscope.receiver.zstd_module import zstd  # noqa: E402
from sloscope.receiver.limits import Limits  # noqa: E402
from sloscope.receiver.server import fast_decode  # noqa: E402
from tests.envoy_spans import SIDECAR, envoy_request  # noqa: E402

ENCODERS = {  # as the Collector's encoders write them, at their default levels
    "gzip": gzip.compress,
    "zstd": zstd.compress,
    "zlib": zlib.compress,
    "snappy": lambda body: bytes(cramjam.snappy.compress_raw(body)),
    "x-snappy-framed": lambda body: bytes(cramjam.snappy.compress(body)),
    "lz4": lz4.frame.compress,
}


class Unbounded:
    def reserve(self, n: int) -> None:
        pass


def seconds_per_body(work, body: bytes, requests: int) -> float:
    started = time.perf_counter()
    for _ in range(requests):
        work(body)
    return (time.perf_counter() - started) / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-request", type=int, default=1000, help="SERVER spans per request")
    parser.add_argument("--requests", type=int, default=100, help="times each body is decoded")
    args = parser.parse_args()
    body = envoy_request(SIDECAR, spans=args.per_request).SerializeToString()
    limit, held = Limits().max_body_bytes, Unbounded()
    baseline = seconds_per_body(lambda b: fast_decode("traces", b, False), body, args.requests)
    print(f"Envoy sidecar spans, {args.per_request} per request: {len(body):,} bytes plain")
    print(f"  fast path decode of the plain body (baseline): {baseline * 1e3:7.2f} ms")
    for coding, encode in ENCODERS.items():
        packed = encode(body)
        assert decode(coding, packed, limit, held) == body
        spent = seconds_per_body(lambda b: decode(coding, b, limit, held), packed, args.requests)
        print(f"  {coding:<16} {len(packed) / len(body):6.1%} of the size, decompress {spent * 1e3:6.2f} ms "
              f"= {spent / baseline:5.2f} x baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
