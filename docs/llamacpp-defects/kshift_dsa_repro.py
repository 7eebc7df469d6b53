"""Reproducer: llama.cpp's K-shift (the RoPE re-rotation of cached keys that follows
llama_memory_seq_add, i.e. context shift and cache reuse) corrupts the DSA lightning-indexer key
cache of GLM_DSA (and DEEPSEEK32) models. llama_kv_cache_dsa (src/llama-kv-cache-dsa.cpp) keeps the
indexer keys in an ordinary llama_kv_cache built on a copy of the model's hparams, and shifts it like
one; but those keys
  - hold RoPE on their first n_rot dims ("[rope | nope]", src/models/glm-dsa.cpp), while
    build_graph_shift rotates the last n_rot dims (hparams.n_lora_kv > 0 puts the view at offset
    n_embd_head_k - n_rot, the layout of the MLA latent cache);
  - are stored after a Hadamard transform (self_k_rot_lid), which the K-shift of a non-quantized
    cache does not undo before rotating;
  - are roped with LLAMA_ROPE_TYPE_NORM in glm-dsa.cpp, while the shift uses the copy's NEOX.

Run with llama.cpp's converter environment:
    $SMEARCLI_LLAMACPP_PYTHON kshift_dsa_repro.py

Builds a tiny random GlmMoeDsaForCausalLM with transformers (2 layers, 4 routed experts, indexer with
4 heads of 64 dims and top-k 8, so that the indexer's choice matters over 48 tokens) and a control
with the same weights and index_topk 64 (every cached key is selected whatever the indexer scores, so
the indexer cache cannot change the output); converts each with the converter's own class (only
set_vocab replaced: no tokenizer) at float32, and runs in llama.cpp (CPU, float32 KV cache, flash
attention off, one thread, in a child process):
  reference  one llama_decode of the 48 tokens at positions 0..47;
  shift      the first 24 tokens decoded at positions 16..39, llama_memory_seq_add(mem, 0, -1, -1,
             -16) (cache positions back to 0..23, which makes the next decode run the K-shift), then
             the other 24 tokens decoded at positions 24..47 in one call.
The control agreeing shows that the MLA cache's own shift is right and that what departs in the
top-k 8 model is the indexer's selection. THRESHOLD = 1e-4 on max |d log-prob|: a correct shift
agrees to float32 rounding (about 1e-6).

Exit 1 while the defect is there (the top-k 8 model departs while the control agrees), 0 once fixed,
2 if it cannot run (or the control itself departs: then something else is wrong).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONVERT_DIR = os.path.join(sys.prefix, "share", "llamacpp-convert")
T, PREFIX, OFFSET = 48, 24, 16
THRESHOLD = 1e-4

try:
    sys.path.insert(0, CONVERT_DIR)
    import numpy as np
    import torch
    import transformers
    import gguf
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class
except Exception as e:  # noqa: BLE001
    print(f"cannot run: {type(e).__name__}: {e}")
    sys.exit(2)


def build(d: Path, top_k: int):
    cfg = transformers.GlmMoeDsaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                       n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                                       kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                       v_head_dim=16, head_dim=16, first_k_dense_replace=1,
                                       mlp_layer_types=["dense", "sparse"], indexer_types=["full", "full"],
                                       index_n_heads=4, index_head_dim=64, index_topk=top_k,
                                       max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    m = transformers.GlmMoeDsaForCausalLM(cfg)
    m.save_pretrained(d)
    return m


def convert(d: Path, out: Path):
    cls = get_model_class(get_model_architecture(ModelBase.load_hparams(d, False), ModelType.TEXT), mmproj=False)

    class NoVocab(cls):
        model_arch = cls.model_arch

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")
            self.gguf_writer.add_vocab_size(int(self.hparams["vocab_size"]))

    import logging
    logging.disable(logging.WARNING)
    with torch.inference_mode():
        NoVocab(d, gguf.LlamaFileType.ALL_F32, out, eager=True).write()


# the child: the one-call reference and the shift schedule, with the low-level bindings
CHILD = r"""
import sys, json, ctypes, numpy as np
import llama_cpp.llama_cpp as L
g, toks, P, K, out = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
quiet = L.llama_log_callback(lambda level, text, data: None)
L.llama_log_set(quiet, None)
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.n_gpu_layers = 0
model = L.llama_model_load_from_file(g.encode(), mp)
assert model, "llama.cpp did not load the model"
V, T = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model)), len(toks)

def context():
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2 * T + 32, T, T, 1
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = cp.type_v = L.GGML_TYPE_F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return L.llama_init_from_model(model, cp)

def decode(ctx, items):
    b = L.llama_batch_init(len(items), 0, 1)
    b.n_tokens = len(items)
    for i, (t, p) in enumerate(items):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, 1
        b.seq_id[i][0] = 0
    rc = L.llama_decode(ctx, b)
    assert rc == 0, f"llama_decode returned {rc}"
    r = [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(V,)).astype(np.float64) for i in range(len(items))]
    L.llama_batch_free(b)
    return r

def keys(ctx):
    # the cached keys of sequence 0, read from llama_state_seq_get_data (float32 cache, one stream):
    # per cache (the MLA cache, then the indexer cache): cells, then per layer K rows (cells x row)
    n = L.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * n)()
    assert L.llama_state_seq_get_data(ctx, buf, n, 0) == n
    b, o, res = bytes(buf), 8, []
    def rd(fmt):
        nonlocal o
        v = np.frombuffer(b, fmt, 1, o)[0]
        o += np.dtype(fmt).itemsize
        return int(v)
    while o < len(b):
        assert rd("<u4") == 1
        cells = rd("<u4")
        for _ in range(cells):
            rd("<i4")
            n_seq = rd("<u4")
            o += 4 * n_seq
        rd("<u4")
        layers = []
        for _ in range(rd("<u4")):
            assert rd("<i4") == 0  # GGML_TYPE_F32
            row = rd("<u8")
            layers.append(np.frombuffer(b, "<f4", cells * row // 4, o).reshape(cells, row // 4).astype(np.float64))
            o += cells * row
        for _ in layers:  # transposed V, where the cache has one
            if o >= len(b) or np.frombuffer(b, "<i4", 1, o)[0] != 0:
                break
            o += 4
            el, ne = rd("<u4"), rd("<u4")
            o += el * ne * cells
        res.append(layers)
    return res

def flat(tag, caches):
    return {f"{tag}_{c}_{l}": k for c, layers in enumerate(caches) for l, k in enumerate(layers)}

ctx = context()
ref = np.stack(decode(ctx, [(t, p) for p, t in enumerate(toks)]))
try:
    st = flat("R", keys(ctx))
except Exception:
    st = {}
L.llama_free(ctx)
ctx = context()
mem = L.llama_get_memory(ctx)
can = bool(L.llama_memory_can_shift(mem))
got = decode(ctx, [(t, p + K) for p, t in enumerate(toks[:P])])
try:
    st.update(flat("S1", keys(ctx)))  # before the shift: keys roped at positions K..K+P-1
except Exception:
    st = {}
L.llama_memory_seq_add(mem, 0, -1, -1, -K)
got += decode(ctx, [(t, p) for p, t in enumerate(toks) if p >= P])
try:
    st.update(flat("S2", keys(ctx)))  # after the K-shift and the second decode
except Exception:
    st = {}
L.llama_free(ctx)
np.savez(out, ref=ref, got=np.stack(got), can=can, **st)
"""


def rope(x, shift, n_rot, base, kind, off):
    """ggml's RoPE by `shift` positions on dims off..off+n_rot of each row: NORM pairs (2i, 2i+1), NEOX (i, i+n_rot/2)"""
    x = x.copy()
    th = shift * base ** (-np.arange(0, n_rot, 2) / n_rot)
    c, s = np.cos(th), np.sin(th)
    seg = x[:, off:off + n_rot]
    ia, ib = (slice(0, None, 2), slice(1, None, 2)) if kind == "norm" else (slice(0, n_rot // 2), slice(n_rot // 2, None))
    a, b = seg[:, ia].copy(), seg[:, ib].copy()
    seg[:, ia], seg[:, ib] = a * c - b * s, a * s + b * c
    return x


def hadamard(n):
    """the orthonormal Sylvester Walsh-Hadamard matrix llama.cpp generates (symmetric, its own inverse)"""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def cache_check(z, kv):
    """the indexer key cache itself: after the shift against the one-call prefill's, and both against what
    llama.cpp's K-shift does and what a correct shift would do to the rows cached before the shift"""
    if "S2_1_0" not in z:
        print("  (cache-level check skipped: the state layout was not the one expected)")
        return
    n_rot, base = int(kv["rope.dimension_count"]), float(kv["rope.freq_base"])
    for l in range(sum(1 for k in z.files if k.startswith("S2_1_"))):
        r, s1, s2 = z[f"R_1_{l}"][:PREFIX], z[f"S1_1_{l}"][:PREFIX], z[f"S2_1_{l}"][:PREFIX]
        d = r.shape[1]
        h = hadamard(d)
        as_llama = rope(s1, -OFFSET, n_rot, base, "neox", d - n_rot)
        correct = h @ rope((h @ s1.T).T, -OFFSET, n_rot, base, "norm", 0).T
        mla = np.abs(z[f"S2_0_{l}"][:PREFIX] - z[f"R_0_{l}"][:PREFIX]).max()
        print(f"  layer {l}, cached keys of positions 0..{PREFIX - 1} after the shift vs the one-call prefill's: "
              f"MLA cache {mla:.3g}, indexer cache {np.abs(s2 - r).max():.3g} (largest |key| {np.abs(r).max():.3g})")
        print(f"    indexer keys before the shift, NEOX-rotated by -{OFFSET} on their last {n_rot} dims, Hadamard "
              f"left in (what build_graph_shift does) vs the cache after the shift: {np.abs(as_llama - s2).max():.3g}")
        print(f"    the same keys, Hadamard undone, NORM-rotated by -{OFFSET} on their first {n_rot} dims, Hadamard "
              f"redone (a correct shift) vs the one-call prefill's: {np.abs(correct.T - r).max():.3g}")


def logprobs(a):
    a = a - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


def run(label: str, top_k: int, t: Path, toks):
    d, g, npz = t / f"m{top_k}", t / f"m{top_k}.gguf", t / f"r{top_k}.npz"
    try:
        build(d, top_k)
        convert(d, g)
        f = gguf.GGUFReader(str(g)).fields
        kv = {k.split(".", 1)[1]: f[k].contents() for k in f if k.startswith("glm-dsa.")}
    except Exception as e:  # noqa: BLE001
        print(f"cannot run: {label}: {type(e).__name__}: {e}")
        return None
    r = subprocess.run([sys.executable, "-I", "-c", CHILD, str(g), json.dumps(toks), str(PREFIX), str(OFFSET), str(npz)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not npz.is_file():
        said = [ln for ln in (r.stderr or "").splitlines() if ln.strip()]
        print(f"{label}: llama.cpp died (return code {r.returncode}): {said[-1][:300] if said else ''}")
        return None
    z = np.load(npz)
    diff = np.abs(logprobs(z["got"]) - logprobs(z["ref"])).max(-1)
    first = int(np.argmax(diff > THRESHOLD)) if (diff > THRESHOLD).any() else None
    print(f"{label}: GGUF glm-dsa: rope.dimension_count {kv.get('rope.dimension_count')}, "
          f"attention.kv_lora_rank {kv.get('attention.kv_lora_rank')}, attention.indexer.key_length "
          f"{kv.get('attention.indexer.key_length')}, attention.indexer.top_k {kv.get('attention.indexer.top_k')}")
    print(f"  llama_memory_can_shift = {bool(z['can'])}")
    print(f"  shift vs one-call prefill, max |d log-prob|: positions 0..{PREFIX - 1} {diff[:PREFIX].max():.3g}, "
          f"positions {PREFIX}..{T - 1} {diff[PREFIX:].max():.3g}"
          + (f"  (first past {THRESHOLD:g} at position {first})" if first is not None else ""))
    if top_k < T:
        cache_check(z, kv)
    return float(diff.max())


def main() -> int:
    toks = torch.randint(0, 256, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"schedule: {PREFIX} tokens at positions {OFFSET}..{OFFSET + PREFIX - 1}, "
          f"llama_memory_seq_add(mem, 0, -1, -1, -{OFFSET}), then {T - PREFIX} tokens at positions {PREFIX}..{T - 1}; "
          f"reference: one call, positions 0..{T - 1}; threshold {THRESHOLD:g}")
    with tempfile.TemporaryDirectory(prefix="kshift-dsa-repro-") as t:
        t = Path(t)
        bad = run("A (GLM-DSA, indexer top-k 8 of 48: the indexer cache decides)", 8, t, toks)
        ctl = run("B (control: same weights, indexer top-k 64: every key selected)", 64, t, toks)
    if bad is None or ctl is None:
        return 2
    if ctl > THRESHOLD:
        print(f"the control departs too ({ctl:.3g}): not (only) the indexer cache, nothing concluded")
        return 2
    if bad > THRESHOLD:
        print("DEFECT PRESENT: the K-shift changed the indexer's selection; the control (indexer irrelevant) agrees")
        return 1
    print("OK: the shift schedule matches the one-call prefill with and without the indexer deciding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
