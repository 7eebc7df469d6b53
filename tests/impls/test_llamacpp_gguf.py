"""A user's GGUF is untrusted: `smearcli.engines.llamacpp.gguf_header.check` refuses, with the reason,
every file whose header lies (tensor counts, tensor sizes past the file), a truncated file, a
huge declared vocabulary or one of another size than the config's, before llama.cpp sees it. The
files are built here byte by byte with `struct`, from the GGUF layout (magic, version, counts, the
key/value pairs, the tensor infos, the aligned data)."""

import struct

import pytest

from smearcli.engines.llamacpp.gguf_header import MAX_VOCAB, BadGGUF, check

U32, STR, ARR = 4, 8, 9


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<I", U32) + struct.pack("<I", v)


def kv_str(key, v):
    return s(key) + struct.pack("<I", STR) + s(v)


def kv_tokens(n, declared=None):
    return (s("tokenizer.ggml.tokens") + struct.pack("<I", ARR) + struct.pack("<IQ", STR, n if declared is None
                                                                             else declared)
            + b"".join(s(f"t{i}") for i in range(n)))


def gguf(arch="llama", vocab=8, embd=4, kvs=None, n_tensors=None, dims=None, version=3, n_kv=None, data=None,
         ttype=0):
    """A GGUF with one float32 token_embd.weight of `dims` (default embd x vocab) and its data."""
    dims = dims or [embd, vocab]
    kvs = [kv_str("general.architecture", arch)] + (kvs if kvs is not None else [kv_tokens(vocab)])
    tensor = s("token_embd.weight") + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) \
        + struct.pack("<IQ", ttype, 0)
    head = (b"GGUF" + struct.pack("<I", version) + struct.pack("<Q", 1 if n_tensors is None else n_tensors)
            + struct.pack("<Q", len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + tensor)
    head += b"\0" * (-len(head) % 32)
    return head + (data if data is not None else b"\0" * (4 * embd * vocab))


def write(tmp_path, data: bytes, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def refused(tmp_path, data, vocab=None) -> str:
    with pytest.raises(BadGGUF) as e:
        check(write(tmp_path, data), vocab)
    return str(e.value)


def test_a_well_formed_file_passes_with_what_it_declares(tmp_path):
    h = check(write(tmp_path, gguf(vocab=8, embd=4)), vocab=8)
    assert (h.version, h.architecture, h.n_tensors, h.vocab, h.embd_rows) == (3, "llama", 1, 8, 8)
    assert h.types == {"F32": 1} and h.float32


def test_the_vocabulary_from_the_vocab_size_key_when_there_is_no_token_list(tmp_path):
    h = check(write(tmp_path, gguf(vocab=8, kvs=[kv_u32("llama.vocab_size", 8)])), vocab=8)
    assert h.vocab == 8


def test_not_a_gguf_and_an_unknown_version(tmp_path):
    assert "magic" in refused(tmp_path, b"PK\x03\x04" + b"\0" * 64)
    assert "version 1" in refused(tmp_path, gguf(version=1))
    assert "magic" in refused(tmp_path, b"GG")


def test_a_header_that_lies_about_its_tensor_count(tmp_path):
    # the data's zeros read as the next tensor's info: a tensor of no dimensions
    assert "has 0 dimensions" in refused(tmp_path, gguf(n_tensors=5))
    assert "truncated" in refused(tmp_path, gguf(n_tensors=5, data=b""))
    assert "over the" in refused(tmp_path, gguf(n_tensors=1 << 40))


def test_a_header_that_lies_about_its_key_value_count(tmp_path):
    # the tensor info's bytes read as a key: a string longer than the bounds
    assert "key 3 declares" in refused(tmp_path, gguf(n_kv=9))
    assert "key/value pairs, over the" in refused(tmp_path, gguf(n_kv=1 << 33))


def test_a_tensor_whose_declared_size_runs_past_the_file(tmp_path):
    msg = refused(tmp_path, gguf(dims=[4096, 4096], vocab=8))
    assert "token_embd.weight declares 67,108,864 bytes" in msg and "past the end" in msg


def test_a_truncated_file(tmp_path):
    whole = gguf(vocab=64, embd=16)
    assert "past the end" in refused(tmp_path, whole[:len(whole) - 100])  # the data cut short
    assert refused(tmp_path, whole[:40]).startswith("truncated")  # the header cut short


def test_a_huge_declared_vocabulary(tmp_path):
    msg = refused(tmp_path, gguf(kvs=[kv_tokens(2, declared=MAX_VOCAB * 4)]))
    assert f"a vocabulary of {MAX_VOCAB * 4:,} tokens, over the {MAX_VOCAB:,} limit" in msg
    msg = refused(tmp_path, gguf(kvs=[kv_u32("llama.vocab_size", 50_000_000)]))
    assert "50,000,000 tokens, over the" in msg


def test_a_vocabulary_of_another_size_than_the_config(tmp_path):
    msg = refused(tmp_path, gguf(vocab=8), vocab=128)
    assert "8 tokens, the config's vocab_size 128" in msg


def test_no_architecture_and_a_tensor_of_an_unknown_type(tmp_path):
    assert "general.architecture" in refused(tmp_path, gguf(arch=""))
    assert "type 99" in refused(tmp_path, gguf(ttype=99))
