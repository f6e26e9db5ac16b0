#!/usr/bin/env python3
"""Hostile frames of kinds 11 (gather_rows) and 12 (push_sparse) against a running sparse
job's ps data plane (loopback). usage: dp_fuzz.py PORT [TABLE_SHARD] [AGGREGATOR]
Each case prints what the node answered; the ps must keep serving (a good gather last)."""
import socket, struct, sys, time

MAGIC = 0x50444641
F32, F64, I32, I64 = 0, 1, 2, 3
port = int(sys.argv[1])
shard = sys.argv[2] if len(sys.argv) > 2 else "user_emb/part_1"
agg = sys.argv[3] if len(sys.argv) > 3 else "train/sparse/ps1"

def header(kind, name, has_tensor=0, dtype=0, dims=(), payload=0, reserved=0, version=0, magic=MAGIC):
    d = list(dims) + [0] * (8 - len(dims))
    return struct.pack("<IBBBBBBHIQQ8q", magic, kind, 0, has_tensor, dtype, len(dims), 0,
                       reserved, len(name), version, payload, *d) + name

def reply(s, timeout=10):
    s.settimeout(timeout)
    buf = b""
    while len(buf) < 96:
        c = s.recv(96 - len(buf))
        if not c:
            return "closed" + (" after %d header bytes" % len(buf) if buf else "")
        buf += c
    f = struct.unpack("<IBBBBBBHIQQ8q", buf)
    status, rank, payload = f[6], f[5], f[10]
    body = b""
    want = min(payload, 4096)
    while len(body) < want:
        c = s.recv(want - len(body))
        if not c:
            break
        body += c
    if status:
        return "status %d: %s" % (status, body.decode(errors="replace")[:300])
    return "ok rank %d dims %s payload %d version %d" % (rank, f[11:11 + rank], payload, f[9])

def case(title, data, read=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    t0 = time.time()
    try:
        s.sendall(data)
        r = reply(s) if read else "sent"
    except Exception as e:
        r = "exception %r" % e
    print("%-55s %.2fs  %s" % (title, time.time() - t0, r))
    s.close()

name = shard.encode()
ids = struct.pack("<3q", 0, 1, 2)
case("gather 3 ids (good)", header(11, name, 1, I64, [3], 24) + ids)
case("gather id -1", header(11, name, 1, I64, [1], 8) + struct.pack("<q", -1))
case("gather id 2^63-1", header(11, name, 1, I64, [1], 8) + struct.pack("<q", 2**63 - 1))
case("gather int32 id -2^31", header(11, name, 1, I32, [1], 4) + struct.pack("<i", -2**31))
case("gather 0 ids", header(11, name, 1, I64, [0], 0))
case("gather float ids", header(11, name, 1, F32, [1], 4) + b"\0" * 4)
case("gather rank 2 ids", header(11, name, 1, I64, [1, 1], 8) + b"\0" * 8)
case("gather no tensor", header(11, name, 0, I64, [], 0))
case("gather unknown var", header(11, b"nope", 1, I64, [1], 8) + b"\0" * 8)
case("gather dims -1", header(11, name, 1, I64, [-1], 0))
case("gather declares 2^40 ids", header(11, name, 1, I64, [2**40], 2**43))
case("gather 1e8 ids declared, none sent", header(11, name, 1, I64, [10**8], 8 * 10**8))
case("gather the optimizer slot name", header(11, name + b"/m", 1, I64, [1], 8) + b"\0" * 8)
case("gather on the aggregator name", header(11, agg.encode(), 1, I64, [1], 8) + b"\0" * 8)
pre = b"\0" * 16 + struct.pack("<Q", 1)
case("push_sparse name shorter than prefix", header(12, b"x" * 10, 1, I32, [2], 8) + b"\0" * 8)
case("push_sparse no token, abstention", header(12, pre + agg.encode(), reserved=0, version=1))
case("push_sparse no token, 1 GiB declared", header(12, pre + agg.encode(), 1, I32, [2**28], 2**30, reserved=0), read=True)
case("push_sparse no token, worker 65535", header(12, pre + agg.encode(), 1, I32, [4], 16, reserved=65535) + b"\0" * 16)
case("push_sparse prefix only (empty agg name)", header(12, pre, 1, I32, [4], 16) + b"\0" * 16)
case("push_sparse to a variable name", header(12, pre + name, 1, I32, [4], 16) + b"\0" * 16)
case("push_sparse no tensor + payload", header(12, pre + agg.encode(), 0, I32, [], 16) + b"\0" * 16)
case("push (dense) kind 5 to sparse agg", header(5, pre + agg.encode(), 1, F32, [4], 16) + b"\0" * 16)
case("pull kind 6 of sparse agg", header(6, agg.encode()))
case("kind 13 (unknown)", header(13, name))
case("kind 16 (reply) as request", header(16, name))
case("bad magic", header(11, name, magic=0x12345678))
case("name_len 4097", struct.pack("<IBBBBBBHIQQ8q", MAGIC, 11, 0, 0, 0, 0, 0, 0, 4097, 0, 0, *([0]*8)))
case("gather 3 ids (good, after)", header(11, name, 1, I64, [3], 24) + ids)
