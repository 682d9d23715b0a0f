#!/usr/bin/env python3
"""Which API keys does a broker advertise? One raw ApiVersions v0 request.

Usage: apiversions.py HOST:PORT [KEY...]

Without KEYs: prints one line per advertised API, "KEY MIN MAX".
With KEYs: prints the names of the given keys the broker does NOT advertise,
one per line as "Name(key)" (nothing when all are there).
Exit status 0 on an answer, 2 when the broker could not be asked.

The compatibility programs use it to tell a broker gap (the API is not
advertised) from a failure (the API is advertised but does not work):
kcat through this command line, the Python programs through `api_versions`
and `missing`.
"""
import socket
import struct
import sys

NAMES = {
    22: "InitProducerId",
    24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn",
    26: "EndTxn",
    28: "TxnOffsetCommit",
    65: "DescribeTransactions",
    66: "ListTransactions",
}

# The APIs each transactional capability needs.
TRANSACTIONS = (24, 26)
CONSUME_TRANSFORM_PRODUCE = (24, 25, 26, 28)


def _read(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def api_versions(bootstrap, timeout=10.0):
    """{api_key: (min_version, max_version)} from an ApiVersions v0 request."""
    host, port = bootstrap.rsplit(":", 1)
    client_id = b"compat-apiversions"
    header = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    with socket.create_connection((host, int(port)), timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(header)) + header)
        size, = struct.unpack(">i", _read(sock, 4))
        body = _read(sock, size)
    correlation, error, count = struct.unpack_from(">ihi", body, 0)
    if correlation != 1:
        raise ValueError("ApiVersions answer has correlation id %d, sent 1" % correlation)
    if error != 0:
        raise ValueError("ApiVersions v0 answered error code %d" % error)
    out = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", body, 10 + 6 * i)
        out[key] = (lo, hi)
    return out


def name(key):
    return "%s(%d)" % (NAMES.get(key, "key"), key)


def missing(versions, keys):
    """The names of the keys not in versions (a dict or set of API keys)."""
    return [name(k) for k in keys if k not in versions]


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        versions = api_versions(argv[1])
    except (OSError, ValueError, struct.error) as e:
        print("apiversions: %s: %s" % (argv[1], e), file=sys.stderr)
        return 2
    if len(argv) > 2:
        for n in missing(versions, [int(k) for k in argv[2:]]):
            print(n)
    else:
        for key in sorted(versions):
            print("%d %d %d" % (key, *versions[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
