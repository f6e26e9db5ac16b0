#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/ (docs/fuzzing.md): valid
and near-valid inputs, from the repo's own files where it has them. Run from
anywhere; it overwrites only the seed_* files it makes, so inputs the fuzzer
added (hash names) stay."""
import os, struct, shutil

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
corpus = os.path.join(root, "fuzz", "corpus")

def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def copy(target, path):
    with open(os.path.join(root, path), "rb") as f:
        put(target, os.path.basename(path), f.read())

# -- configs
copy("cluster_toml", "config/cluster.toml")
copy("cluster_toml", "config/train.toml")
put("cluster_toml", "ipv6.toml", '[cluster]\nps = ["[::1]:2222"]\nworker = ["127.0.0.1:2223"]\n')
put("cluster_toml", "security.toml",
    '[cluster]\nps = ["localhost:1"]\n[node]\nbind = "0.0.0.0"\ndata_port = 7\n'
    '[security]\nca = "ca.pem"\ncertificate = "{name}.pem"\nkey = "{name}.key"\ninsecure = false\n')
put("cluster_toml", "bad_port.toml", '[cluster]\nps = ["localhost:99999"]\n')
put("cluster_toml", "typo.toml", '[cluster]\nps = ["localhost:1"]\n[node]\nthreds = 2\n')
copy("cluster_json", "config/tf_config.json")
put("cluster_json", "bare.json", '{"ps": ["h:1"], "worker": ["[::1]:2", "h:3"]}')
put("cluster_json", "cluster_only.json", '{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}')
put("cluster_json", "bad_index.json", '{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": -1}}')
copy("train_config", "config/train.toml")
put("train_config", "keys_only.toml", 'mode = "async"\nmodel = "softmax"\nbatch_size = 8\nhidden = [4, 4]\n')
put("train_config", "bad.toml", '[train]\nmode = "sinc"\nlearning_rate = -1\nhidden = [0]\n')

# -- deep nesting near the bound (core/nesting.hpp: 64 levels): the fuzzer
# grows them past it; fuzz/regressions/ holds inputs thousands deep.
def deep(n, open_, close, inner=""):
    return open_ * n + inner + close * n
for target, prefix in (("cluster_toml", '[cluster]\nps = ["a:1"]\n'), ("train_config", "[train]\n")):
    put(target, "deep_array.toml", prefix + "x = " + deep(63, "[", "]", "1") + "\n")
    put(target, "deep_inline_table.toml", prefix + "x = " + "{a = " * 63 + "1" + "}" * 63 + "\n")
    put(target, "deep_dotted_key.toml", prefix + ".".join(["a"] * 63) + " = 1\n")
put("cluster_json", "deep_array.json", '{"cluster": {"ps": ["a:1"]}, "x": ' + deep(62, "[", "]") + "}")
put("cluster_json", "deep_object.json", '{"cluster": {"ps": ["a:1"]}, "x": ' + '{"a": ' * 62 + "1" + "}" * 62 + "}")
put("repl_parser", "deep_parens", "x = " + deep(150, "(", ")", "1") + "\n")
put("repl_parser", "deep_blocks", "with device('/cpu:0'):\n" * 60 + "  x = 1\n")

# -- device names
for i, name in enumerate(["/job:ps/replica:0/task:1/device:CPU:0", "/cpu:0", "/gpu:1",
                          "/device:GPU:*", "/job:worker/task:3/gpu:2", "/job:ps/task:0",
                          "", "/job:a/replica:2147483647/task:0/device:cpu:9",
                          "/job:x/task:-1", "/device:TPU:0"]):
    put("device_name", str(i), name)

# -- data-plane frames (core/wire_format.hpp): 96-byte header, name, payload
MAGIC = 0x50444641
def header(kind, name_len=0, has_tensor=0, dtype=0, dims=(), payload=0, status=0,
           want=0, version=0, reserved=0):
    d = list(dims) + [0] * (8 - len(dims))
    return struct.pack("<IBBBBBBHIQQ8q", MAGIC, kind, want, has_tensor, dtype, len(dims),
                       status, reserved, name_len, version, payload, *d)
assert len(header(1)) == 96
def frame(kind, name, dims=None, values=None, want=0, dtype=0):
    if dims is None:
        return header(kind, len(name), want=want) + name
    payload = b"".join(struct.pack("<f", v) for v in values)
    return header(kind, len(name), 1, dtype, dims, len(payload), want=want) + name + payload
read_v = frame(1, b"v")
assign_v = frame(2, b"v", [], [3.0], want=1)
add_v = frame(3, b"v", [], [1.0])
sub_2x2 = frame(4, b"v", [2, 2], [1, 2, 3, 4])
push = frame(5, b"agg", [2], [0.5, 0.5])
pull = frame(6, b"agg")
pushed = frame(15, b"\0" * 24 + b"agg", [2], [0.5, 0.5])  # push_streamed: prefix, name, floats
reply = header(16, 0, 1, 0, [1], 4) + struct.pack("<f", 2.0)
for n, h in [("read", read_v[:96]), ("assign", assign_v[:96]), ("push", push[:96]),
             ("push_streamed", pushed[:96]),
             ("reply", reply[:96]), ("rank8", header(2, 1, 1, 3, [1] * 8, 8)),
             ("huge", header(2, 1, 1, 1, [1 << 31, 1 << 31], 0)),
             ("error_reply", header(16, 0, 0, 0, (), 12, status=3))]:
    put("wire_header", n, h)
for n, f in [("read", read_v), ("assign_read", assign_v + read_v), ("add", add_v),
             ("sub_wrong_shape", sub_2x2), ("push", push), ("pull", pull),
             ("push_streamed", pushed),
             ("unknown_var", frame(1, b"nope")), ("half_header", read_v[:40]),
             ("bad_magic", b"XXXX" + read_v[4:]), ("pipelined", read_v * 3)]:
    put("data_plane", n, f)
# Pushes to the harness's aggregators (fuzz/harness_plane.cpp): it writes
# the worker's token into the prefix and makes a step of 0 the global step,
# so that these reach a pipelined round (sync) and the async line.
def to_agg(kind, agg, worker, values, seq=0):
    name = b"\0" * 16 + struct.pack("<Q", seq) + agg
    payload = b"".join(struct.pack("<f", v) for v in values)
    dims = [len(values)] if values else []
    return header(kind, len(name), 1 if values else 0, 0, dims, len(payload),
                  reserved=worker) + name + payload
g5 = [0.5, -0.25, 1e-3, 3.0, -1.0]
for agg in (b"agg_sync", b"agg_async"):
    tag = agg.decode()
    for n, f in [("streamed_w0", to_agg(15, agg, 0, g5)),
                 ("streamed_both", to_agg(15, agg, 0, g5) + to_agg(15, agg, 1, g5)),
                 ("streamed_nan", to_agg(15, agg, 1, g5[:3] + [float("nan")] + g5[4:])),
                 ("streamed_half", to_agg(15, agg, 0, g5)[:-8]),
                 ("streamed_short", to_agg(15, agg, 0, g5[:4])),
                 ("whole_then_streamed", to_agg(5, agg, 1, g5) + to_agg(15, agg, 0, g5)),
                 ("abstain_then_streamed", to_agg(5, agg, 1, []) + to_agg(15, agg, 0, g5)),
                 ("streamed_numbered", to_agg(15, agg, 0, g5, seq=7) + to_agg(15, agg, 0, g5, seq=7)),
                 ("pull", frame(6, agg))]:
        put("data_plane", tag + "_" + n, f)
# gather_many (kind 14): parts, their 16-byte descriptions, the names padded
# to 8, then the ids; the payload described as int32 words.
def gather_many(parts):
    desc = b"".join(struct.pack("<IIQ", len(nm), what, len(ids)) for nm, what, ids in parts)
    names = b"".join(nm for nm, _, _ in parts)
    names += b"\0" * (-len(names) % 8)
    ids = b"".join(struct.pack("<q", i) for _, _, idl in parts for i in idl)
    payload = struct.pack("<II", len(parts), 0) + desc + names + ids
    return header(14, 0, 1, 2, [len(payload) // 4], len(payload)) + payload
for n, f in [("gather_many_value", gather_many([(b"v", 1, [])])),
             ("gather_many_two", gather_many([(b"v", 1, []), (b"v", 1, [])])),
             ("gather_many_rows_of_scalar", gather_many([(b"v", 0, [0])])),
             ("gather_many_missing", gather_many([(b"nope", 1, []), (b"v", 1, [])]))]:
    put("data_plane", n, f)

# -- tensors as CAF's binary_serializer writes them (messages/types.cpp):
# has_value u8, dtype u8, shape (varbyte count, big-endian int64s), then the
# buffer as one varbyte-sized raw blob in host order.
def varbyte(n):
    out = b""
    while n > 0x7f:
        out += bytes([(n & 0x7f) | 0x80]); n >>= 7
    return out + bytes([n])
def tensor(dtype, dims, raw):
    return (bytes([1, dtype]) + varbyte(len(dims)) + b"".join(struct.pack(">q", d) for d in dims)
            + varbyte(len(raw)) + raw)
put("tensor_decode", "empty", bytes([0]))
put("tensor_decode", "scalar", tensor(0, [], struct.pack("<f", 7.0)))
put("tensor_decode", "f32_2x2", tensor(0, [2, 2], struct.pack("<4f", 1, 2, 3, 4)))
put("tensor_decode", "f64_3", tensor(1, [3], struct.pack("<3d", 1, 2, 3)))
put("tensor_decode", "i64_0x5", tensor(3, [0, 5], b""))
put("tensor_decode", "short", tensor(2, [4], struct.pack("<3i", 1, 2, 3)))
put("tensor_decode", "big_claim", bytes([1, 0, 1]) + struct.pack(">q", 1 << 28) + varbyte(1 << 30))

# -- the REPL's language
for path in sorted(os.listdir(os.path.join(root, "examples"))):
    if path.endswith(".af"):
        copy("repl_parser", os.path.join("examples", path))
for i, line in enumerate(["x = [[1, 2], [3, 4]] @ w + -b", "run inc feed x=[1.5, 2e3]",
                          "with /job:ps/task:0 { repeat 3 { v.assign_add(1) } }",
                          "a, b = f(1, name=\"s\"); print a", "(((1", "x = \"unterminated"]):
    put("repl_parser", "line%d" % i, line)
