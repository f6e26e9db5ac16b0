#!/usr/bin/env python3
"""Forges a table shard file (train/table_checkpoint.cpp's .aftab): writes VALUE (nan, inf,
1e30...) into float INDEX of its rows (row 0's value first) and recomputes that chunk's checksum,
so that every check the restore makes (sizes, header, chunk checksums, manifest) still passes.
The checksums find accidents, not forgery; this shows what a forged file can make a job restore.
usage: forge_shard.py FILE [VALUE] [INDEX]"""
import struct, sys
path = sys.argv[1]
value = float(sys.argv[2]) if len(sys.argv) > 2 else float("nan")
index = int(sys.argv[3]) if len(sys.argv) > 3 else 0
data = bytearray(open(path, "rb").read())
M = 8
hlen = struct.unpack_from("<I", data, M)[0]
start = M + 4 + hlen + 8
chunks = struct.unpack_from("<Q", data, len(data) - M - 8)[0]
trailer = len(data) - M - 8 - 8 * chunks
assert chunks == 1, "this forger handles one-chunk files (%d chunks)" % chunks
struct.pack_into("<f", data, start + 4 * index, value)
def fnv(b):
    h = 0xcbf29ce484222325; i = 0; n = len(b); m = (1 << 64) - 1
    while i + 8 <= n:
        h = ((h ^ struct.unpack_from("<Q", b, i)[0]) * 0x100000001b3) & m; i += 8
    while i < n:
        h = ((h ^ b[i]) * 0x100000001b3) & m; i += 1
    return h
struct.pack_into("<Q", data, trailer, fnv(bytes(data[start:trailer])))
open(path, "wb").write(data)
print("forged %s: float %d = %r, chunk checksum recomputed" % (path, index, value))
