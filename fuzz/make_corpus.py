#!/usr/bin/env python3
"""Write the seed inputs of the `check_safetensors` fuzz target to corpus/check_safetensors/.

Each input is one options byte (bits 0-2 family index into attn-bench's FamilyId::ALL, bit 3 the
bhnd layout, bits 4-5 the causal mask, bits 6-7 the window) followed by a safetensors file: an
8-byte little-endian header length, a JSON header, then the tensors' bytes. Standard library only.
"""
import json
import os
import struct

DTYPES = {"F32": ("<f", 4), "F16": ("<e", 2), "I32": ("<i", 4), "I64": ("<q", 8)}


def tensor(dtype, shape, values=None):
    fmt, size = DTYPES.get(dtype, (None, 2))
    n = 1
    for s in shape:
        n *= s
    if values is None:
        values = [((i * 37) % 17 - 8) / 8.0 for i in range(n)]
    if fmt is None:  # BF16: the top half of an f32
        data = b"".join(struct.pack("<f", v)[2:] for v in values)
    else:
        data = b"".join(struct.pack(fmt, v) for v in values)
    assert len(data) == n * size
    return dtype, shape, data


def safetensors(tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "check_safetensors")
    os.makedirs(out, exist_ok=True)
    b, nq, nk, h, d = 1, 3, 4, 2, 4
    seeds = {
        # softmax, bnhd, no mask: q, k, v only.
        "dense_f32": (0x00, {"q": tensor("F32", [b, nq, h, d]), "k": tensor("F32", [b, nk, h, d]),
                             "v": tensor("F32", [b, nk, h, d])}),
        # cosine-sim, bhnd, causal top-left, with dO: the backward runs too.
        "bhnd_f16_backward": (0x19, {"q": tensor("F16", [b, h, nq, d]), "k": tensor("F16", [b, h, nk, d]),
                                     "v": tensor("F16", [b, h, nk, d]), "do": tensor("F16", [b, h, nq, d])}),
        # softmax with a broadcast bias and key lengths, a window, bf16.
        "bias_keylens_bf16": (0x80, {"q": tensor("BF16", [2, nq, h, d]), "k": tensor("BF16", [2, nk, h, d]),
                                     "v": tensor("BF16", [2, nk, h, d]), "bias": tensor("BF16", [1, h, nq, nk]),
                                     "key_lens": tensor("I64", [2], [4, 1]),
                                     "do": tensor("BF16", [2, nq, h, d])}),
        # Packed varlen, causal bottom-right, hyperbolic, i32 offsets.
        "varlen_i32": (0x24, {"q": tensor("F32", [5, h, d]), "k": tensor("F32", [6, h, d]),
                              "v": tensor("F32", [6, h, d]), "cu_seqlens_q": tensor("I32", [3], [0, 2, 5]),
                              "cu_seqlens_k": tensor("I32", [3], [0, 4, 6]), "do": tensor("F32", [5, h, d])}),
        # Taylor (order 2), GQA (2 query heads on 1 kv head), causal top-left, Dv ≠ D.
        "taylor_gqa": (0x13, {"q": tensor("F32", [1, nq, 2, d]), "k": tensor("F32", [1, nk, 1, d]),
                              "v": tensor("F32", [1, nk, 1, 3]), "do": tensor("F32", [1, nq, 2, 3])}),
    }
    for name, (opts, tensors) in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([opts]) + safetensors(tensors))


if __name__ == "__main__":
    main()
