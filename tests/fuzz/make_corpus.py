#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/{safetensors,idx}/): a few small
valid files and a few interesting invalid ones, each under 4 KB. Standard library only, and
deterministic (gzip without a timestamp), so rerunning it rewrites the committed files unchanged.
The fuzzers find their way from these seeds to the rest; scripts/fuzz.sh works on a copy."""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(folder, name, data):
    assert len(data) < 4096, (name, len(data))
    path = os.path.join(HERE, "corpus", folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# --- safetensors: 8-byte little-endian header length, JSON header, data -------------------------
def safetensors(header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else header.encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def header(tensors, metadata=None):
    h = {"__metadata__": metadata} if metadata else {}
    h.update(tensors)
    return json.dumps(h, separators=(",", ":"))


f32 = struct.pack("<2f", 1.5, -2.0)
f64 = struct.pack("<3d", 1.0 / 3.0, -0.0, 1e300)
i64 = struct.pack("<2q", -(2**63), 2**63 - 1)
write("safetensors", "valid_empty", safetensors("{}"))
write("safetensors", "valid_one_f32", safetensors(header({"w": entry("F32", [2], 0, 8)}, {"step": "1"}), f32))
write("safetensors", "valid_dtypes", safetensors(
    header({"a": entry("F32", [2, 1], 0, 8), "b": entry("F64", [3], 8, 32), "c": entry("I64", [2], 32, 48),
            "scalar": entry("F32", [], 48, 52), "empty": entry("F64", [0, 3], 52, 52)}),
    f32 + f64 + i64 + struct.pack("<f", 3.5)))
write("safetensors", "valid_unpadded_escapes", safetensors(
    '{"w\\u00e9\\"[{":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', struct.pack("<f", 7.0), pad=False))
with open(os.path.join(HERE, "..", "fixtures", "io", "torch_written.safetensors"), "rb") as f:
    write("safetensors", "valid_torch_written", f.read())
write("safetensors", "bad_overlap", safetensors(
    header({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}), bytes(12)))
write("safetensors", "bad_duplicate_key", safetensors(
    '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    f32))
write("safetensors", "bad_number_overflow", safetensors('{"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}}',
                                                        f32))
write("safetensors", "bad_nested", safetensors('{"w":' + "[" * 70 + "]" * 70 + "}"))
write("safetensors", "bad_zero_times_huge", safetensors(header({"w": entry("F32", [0, 2**62, 4], 0, 0)})))
write("safetensors", "bad_nine_dims", safetensors(header({"w": entry("F32", [1] * 9, 0, 4)}), bytes(4)))
write("safetensors", "bad_header_length", struct.pack("<Q", 1 << 40) + b"{}")
write("safetensors", "bad_truncated", safetensors(header({"w": entry("F64", [3], 0, 24)}), f64[:20]))

# --- IDX: magic {0, 0, type, ndims}, big-endian uint32 dims, big-endian values ------------------
def idx(type_code, dims, data):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def gz(data):
    return gzip.compress(data, mtime=0)


ubyte = idx(0x08, [2, 3], bytes([0, 1, 127, 128, 254, 255]))
write("idx", "valid_ubyte", ubyte)
write("idx", "valid_ubyte.gz", gz(ubyte))
write("idx", "valid_byte", idx(0x09, [3], bytes([0xFF, 0x80, 5])))
write("idx", "valid_short", idx(0x0B, [2], struct.pack(">2h", -2, 258)))
write("idx", "valid_int", idx(0x0C, [1, 2], struct.pack(">2i", -1, 0x01020304)))
write("idx", "valid_float", idx(0x0D, [2, 2], struct.pack(">4f", 1.5, -2.5, 1e30, float("nan"))))
write("idx", "valid_double.gz", gz(idx(0x0E, [3], struct.pack(">3d", 1.0 / 3.0, -1e300, float("inf")))))
write("idx", "valid_empty", idx(0x08, [0, 5], b""))
write("idx", "valid_two_gzip_members.gz", gz(idx(0x08, [4], b"")) + gz(b"abcd"))
write("idx", "bad_zero_times_huge", idx(0x08, [0, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], b""))
write("idx", "bad_wide_as_int64", idx(0x08, [0, 0xFFFFFFFF, 1 << 29], b""))  # fits as ubyte, not as int64
write("idx", "bad_claims_4gb", idx(0x08, [0xFFFFFFFF], b"abc"))
write("idx", "bad_trailing", idx(0x0B, [2], b"abcde"))
write("idx", "bad_truncated.gz", gz(idx(0x08, [200], bytes(range(200))))[:60])
write("idx", "bad_type", idx(0x0A, [1], b"x"))
