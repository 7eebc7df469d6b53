"""Reproducer: llama.cpp's K-shift (the RoPE re-rotation of cached keys that follows
llama_memory_seq_add, i.e. context shift and cache reuse) also rotates the cached keys of layers
that never had RoPE (NoPE layers) when a model decides those layers in its graph instead of in
hparams.rope_pattern. llama_kv_cache::build_graph_shift (src/llama-kv-cache.cpp) skips a layer only
when !hparams.has_rope(il), and has_rope reads rope_pattern, which the loader fills with 1 for every
layer; src/models/smollm3.cpp skips RoPE on every layer with (il + 1) % 4 == 0 in the graph only.

Run with llama.cpp's converter environment:
    $SMEARCLI_LLAMACPP_PYTHON kshift_nope_repro.py

Builds two tiny random SmolLM3ForCausalLM models with transformers: 4 layers (layer 3 is NoPE in
llama.cpp, as in every SmolLM3) and, as a control, 3 layers (no NoPE layer); converts each with the
converter's own class (only set_vocab replaced: no tokenizer) at float32, and runs in llama.cpp (CPU,
float32 KV cache, flash attention off, one thread, in a child process):
  reference  one llama_decode of the 48 tokens at positions 0..47;
  shift      the first 24 tokens decoded at positions 16..39, llama_memory_seq_add(mem, 0, -1, -1,
             -16) (cache positions back to 0..23, which makes the next decode run the K-shift), then
             the other 24 tokens decoded at positions 24..47 in one call.
For a model whose every cached key carries RoPE the two agree to float32 rounding (the control:
about 1e-6). THRESHOLD = 1e-4 on max |d log-prob| sits two orders above that.

Exit 1 while the defect is there (the 4-layer model departs while the 3-layer control agrees),
0 once fixed, 2 if it cannot run (or the control itself departs: then something else is wrong).
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


def build(d: Path, n_layer: int):
    cfg = transformers.SmolLM3Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    m = transformers.SmolLM3ForCausalLM(cfg)
    m.save_pretrained(d)
    return m, json.loads((d / "config.json").read_text())


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
import sys, json, numpy as np
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

ctx = context()
ref = np.stack(decode(ctx, [(t, p) for p, t in enumerate(toks)]))
L.llama_free(ctx)
ctx = context()
mem = L.llama_get_memory(ctx)
can = bool(L.llama_memory_can_shift(mem))
got = decode(ctx, [(t, p + K) for p, t in enumerate(toks[:P])])
L.llama_memory_seq_add(mem, 0, -1, -1, -K)
got += decode(ctx, [(t, p) for p, t in enumerate(toks) if p >= P])
L.llama_free(ctx)
np.savez(out, ref=ref, got=np.stack(got), can=can)
"""


def transformers_logprobs(m, cfg, toks, rotate_layers):
    """transformers float64, with the keys of the first PREFIX tokens in rotate_layers rotated by -OFFSET
    positions (what llama.cpp's K-shift does to a layer's cache), the rotation done in transformers' own
    rotate_half convention on k_proj's output."""
    m = m.double()
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / (cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.cat([-OFFSET * inv] * 2)
    cos, sin = torch.cos(ang), torch.sin(ang)

    def hook(mod, inp, out):
        x = out.view(1, T, -1, hd).clone()
        y = x[:, :PREFIX]
        x[:, :PREFIX] = y * cos + torch.cat([-y[..., hd // 2:], y[..., :hd // 2]], -1) * sin
        return x.view(out.shape)

    hs = [m.model.layers[i].self_attn.k_proj.register_forward_hook(hook) for i in rotate_layers]
    try:
        with torch.no_grad():
            return torch.log_softmax(m(torch.tensor([toks])).logits[0], -1).numpy()
    finally:
        for h in hs:
            h.remove()


def logprobs(a):
    a = a - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


def run(label: str, n_layer: int, t: Path, toks):
    d, g, npz = t / f"m{n_layer}", t / f"m{n_layer}.gguf", t / f"r{n_layer}.npz"
    try:
        m, cfg = build(d, n_layer)
        convert(d, g)
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
    nope = [i for i in range(n_layer) if (i + 1) % 4 == 0]
    hf_nope = [i for i, u in enumerate(cfg["no_rope_layers"]) if not u]
    first = int(np.argmax(diff > THRESHOLD)) if (diff > THRESHOLD).any() else None
    print(f"{label}: {n_layer} layers; NoPE layers: llama.cpp graph {nope}, config.json no_rope_layers {hf_nope}")
    print(f"  llama_memory_can_shift = {bool(z['can'])}")
    print(f"  shift vs one-call prefill, max |d log-prob|: positions 0..{PREFIX - 1} {diff[:PREFIX].max():.3g}, "
          f"positions {PREFIX}..{T - 1} {diff[PREFIX:].max():.3g}"
          + (f"  (first past {THRESHOLD:g} at position {first})" if first is not None else ""))
    if nope:  # evidence for the mechanism: the departure is the NoPE layer's cached keys rotated by -OFFSET
        got = logprobs(z["got"])[PREFIX:]
        plain = transformers_logprobs(m, cfg, toks, [])
        rot = transformers_logprobs(m, cfg, toks, nope)
        print(f"  llama.cpp one-call prefill vs transformers float64: {np.abs(logprobs(z['ref']) - plain).max():.3g}")
        print(f"  llama.cpp shift, positions {PREFIX}..{T - 1}, vs transformers float64: "
              f"{np.abs(got - plain[PREFIX:]).max():.3g}; vs transformers float64 with layer(s) {nope}'s keys of "
              f"positions 0..{PREFIX - 1} rotated by -{OFFSET} positions: {np.abs(got - rot[PREFIX:]).max():.3g}")
    return float(diff.max())


def main() -> int:
    toks = torch.randint(0, 256, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"schedule: {PREFIX} tokens at positions {OFFSET}..{OFFSET + PREFIX - 1}, "
          f"llama_memory_seq_add(mem, 0, -1, -1, -{OFFSET}), then {T - PREFIX} tokens at positions {PREFIX}..{T - 1}; "
          f"reference: one call, positions 0..{T - 1}; threshold {THRESHOLD:g}")
    with tempfile.TemporaryDirectory(prefix="kshift-nope-repro-") as t:
        t = Path(t)
        bad = run("A (SmolLM3, with a NoPE layer)", 4, t, toks)
        ctl = run("B (control: SmolLM3 without a NoPE layer)", 3, t, toks)
    if bad is None or ctl is None:
        return 2
    if ctl > THRESHOLD:
        print(f"the control departs too ({ctl:.3g}): not this defect, nothing concluded")
        return 2
    if bad > THRESHOLD:
        print("DEFECT PRESENT: the K-shift changed the model with a NoPE layer; the control agrees")
        return 1
    print("OK: the shift schedule matches the one-call prefill with and without a NoPE layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
