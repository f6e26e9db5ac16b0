#!/usr/bin/env python3
"""Forges a table shard file (train/table_checkpoint.cpp's .aftab, format AFTAB002): writes VALUE
(nan, inf, 1e30, 0.5...) into float INDEX of its first chunk (row 0's value first), puts that
chunk's new SHA-256 in the trailer, and rewrites the table's manifest (beside the file) with the
file's new digest and a new checksum line, as a forger without the key can. Without
checkpoint_key every digest then holds: a NaN is still refused by the value checks, a finite
forgery is restored. With checkpoint_key the manifest's HMAC line no longer matches (this script
drops it, having no key): the chief refuses the manifest, naming it.
usage: forge_shard.py FILE [VALUE] [INDEX]"""
import hashlib, os, re, struct, sys
path = sys.argv[1]
value = float(sys.argv[2]) if len(sys.argv) > 2 else float("nan")
index = int(sys.argv[3]) if len(sys.argv) > 3 else 0
data = bytearray(open(path, "rb").read())
M, D = 8, 32
assert data[:M] == b"AFTAB002", "not an AFTAB002 shard file"
hlen = struct.unpack_from("<I", data, M)[0]
header_digest = bytes(data[M + 4 + hlen:M + 4 + hlen + D])
start = M + 4 + hlen + D
chunks = struct.unpack_from("<Q", data, len(data) - M - 8)[0]
trailer = len(data) - M - 8 - D * chunks
# the header's fields (train/table_checkpoint.hpp): the first chunk's size
at = M + 4
def u(n):
    global at
    v = int.from_bytes(data[at:at + n], "little"); at += n; return v
def text():
    global at
    n = u(4); at += n
text(); shard = u(8); n = u(8); u(1)
rows = [u(8) for _ in range(n)]
dims = [u(8) for _ in range(u(4))]
text()
slots = u(4)
for _ in range(slots): text()
u(8); rows_per_chunk = u(8)
floats = 1
for d in dims: floats *= d
chunk_end = start + min(rows_per_chunk, rows[shard]) * floats * 4 * (1 + slots)
struct.pack_into("<f", data, start + 4 * index, value)
data[trailer:trailer + D] = hashlib.sha256(bytes(data[start:chunk_end])).digest()
open(path, "wb").write(data)
file_digest = hashlib.sha256(header_digest + bytes(data[trailer:])).hexdigest()
name = os.path.basename(path)
table = re.sub(r"\.shard-\d+-of-\d+\.aftab$", "", name)
manifest = os.path.join(os.path.dirname(path), table + ".manifest")
lines = open(manifest).read().splitlines(keepends=True)
out = []
for line in lines:
    w = line.split()
    if w and w[0] in ("hmac", "checksum"):
        continue
    if w and w[0] == "shard" and w[2] == name:
        line = "shard %s %s %s %s\n" % (w[1], w[2], w[3], file_digest)
    out.append(line)
text = "".join(out)
text += "checksum " + hashlib.sha256(text.encode()).hexdigest() + "\n"
open(manifest, "w").write(text)
print("forged %s: float %d = %r; chunk digest and manifest %s rewritten (no HMAC line)"
      % (path, index, value, manifest))
