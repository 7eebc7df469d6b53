"""Reproducer: convert_hf_to_gguf writes Bamba's attention RoPE wrongly when the rotary part is a
fraction of the head (every Bamba: partial_rotary_factor 0.5).

Run with llama.cpp's converter environment:
    $SMEARCLI_LLAMACPP_PYTHON bamba_repro.py [--with-suggested-fix]

It builds two tiny random BambaForCausalLM directories with transformers (head_dim 16, rotary 8):
  A  config.json as transformers writes it (rope_parameters.partial_rotary_factor = 0.5);
  B  the same plus "attn_rotary_emb": 8 (the key conversion/granite.py:510 reads);
converts each with the converter's own BambaForCausalLM class (only set_vocab is replaced: the
tiny models have no tokenizer) and checks what the GGUF holds against the config:
  - {arch}.rope.dimension_count must be the rotary width (8);
  - blk.<attn>.attn_q/attn_k rows must be the HF rows with the *rotary part only* reordered from
    HF's rotate_half pairing (i, i + r/2) to llama.cpp's LLAMA_ROPE_TYPE_NORM pairing (2i, 2i+1),
    the pass-through rows left as they are.
It also prints llama.cpp's one-call prefill against transformers (float64), as evidence.

Exit 1 while the defect is there, 0 once fixed, 2 if it cannot run.
--with-suggested-fix applies the fix suggested in the draft (in a subclass, here only) to show
the checks pass once it is in.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONVERT_DIR = os.path.join(sys.prefix, "share", "llamacpp-convert")
FIX = "--with-suggested-fix" in sys.argv

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

HEAD, ROT, NH, NKV = 16, 8, 4, 2


def build(d: Path, attn_rotary_emb):
    cfg = transformers.BambaConfig(vocab_size=256, hidden_size=NH * HEAD, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=NH, num_key_value_heads=NKV, attn_layer_indices=[1],
                                   mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=4,
                                   max_position_embeddings=256)
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5
    torch.manual_seed(0)
    m = transformers.BambaForCausalLM(cfg)
    with torch.no_grad():  # sharper attention so that RoPE shows in the logits
        for n, p in m.named_parameters():
            if n.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(0, 0.5)
    m.save_pretrained(d)
    if attn_rotary_emb is not None:
        j = json.loads((d / "config.json").read_text())
        j["attn_rotary_emb"] = attn_rotary_emb
        (d / "config.json").write_text(json.dumps(j))
    return m


def convert(d: Path, out: Path):
    cls = get_model_class(get_model_architecture(ModelBase.load_hparams(d, False), ModelType.TEXT), mmproj=False)

    class NoVocab(cls):
        model_arch = cls.model_arch

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")
            self.gguf_writer.add_vocab_size(int(self.hparams["vocab_size"]))

        if FIX:  # the suggested fix, applied here only to check that the checks pass once it is in
            def _rot(self):
                hd = self.hparams["hidden_size"] // self.hparams["num_attention_heads"]
                return (self.hparams.get("attn_rotary_emb")
                        or int(hd * self.rope_parameters.get("partial_rotary_factor", 1.0))), hd

            def set_gguf_parameters(self):
                super().set_gguf_parameters()
                self.gguf_writer.add_rope_dimension_count(self._rot()[0])

            def modify_tensors(self, t, name, bid):
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    r, hd = self._rot()
                    nh = self.hparams["num_attention_heads"] if "q_proj" in name else self.hparams["num_key_value_heads"]
                    w = t.reshape(nh, hd, -1)
                    rot = w[:, :r].reshape(nh, 2, r // 2, -1).swapaxes(1, 2).reshape(nh, r, -1)
                    w = torch.cat([rot, w[:, r:]], 1).reshape(t.shape)
                    # pre-apply the inverse of the whole-head permute the base class applies next
                    t = w.reshape(nh, hd // 2, 2, -1).swapaxes(1, 2).reshape(t.shape)
                yield from super().modify_tensors(t, name, bid)

    import logging
    logging.disable(logging.WARNING)
    with torch.inference_mode():
        NoVocab(d, gguf.LlamaFileType.ALL_F32, out, eager=True).write()


def expected_rows(w: torch.Tensor, nh: int) -> np.ndarray:
    """HF q/k rows with only the rotary part reordered to adjacent pairs (what NORM RoPE needs)."""
    w = w.detach().double().reshape(nh, HEAD, -1)
    rot = w[:, :ROT].reshape(nh, 2, ROT // 2, -1).swapaxes(1, 2).reshape(nh, ROT, -1)
    return torch.cat([rot, w[:, ROT:]], 1).reshape(nh * HEAD, -1).numpy()


PREFILL = r"""
import sys, json, numpy as np, llama_cpp
g, toks = sys.argv[1], json.loads(sys.argv[2])
llm = llama_cpp.Llama(model_path=g, n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, verbose=False, n_threads=1,
                      n_threads_batch=1, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
llm.eval(toks)
np.save(sys.argv[3], np.array(llm.scores[:len(toks)], dtype=np.float64))
"""


def prefill_gap(m, g: Path, tmp: Path):
    toks = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    npy = tmp / "ll.npy"
    r = subprocess.run([sys.executable, "-c", PREFILL, str(g), json.dumps(toks[0].tolist()), str(npy)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not npy.is_file():
        return None
    ll = np.load(npy)
    with torch.no_grad():
        ref = torch.log_softmax(m.double()(toks).logits[0], -1).numpy()
    ll = ll - ll.max(-1, keepdims=True)
    ll = ll - np.log(np.exp(ll).sum(-1, keepdims=True))
    return float(np.abs(ll - ref).max())


def main() -> int:
    bad = False
    with tempfile.TemporaryDirectory(prefix="bamba-repro-") as t:
        t = Path(t)
        for label, are in (("A (transformers config, partial_rotary_factor 0.5)", None),
                           ("B (same + attn_rotary_emb 8)", ROT)):
            d = t / f"m{are}"
            try:
                m = build(d, are)
                g = t / f"m{are}.gguf"
                convert(d, g)
                rd = gguf.GGUFReader(str(g))
            except Exception as e:  # noqa: BLE001
                print(f"cannot run: {label}: {type(e).__name__}: {e}")
                return 2
            n_rot = int(rd.fields["granitehybrid.rope.dimension_count"].contents())
            tens = {x.name: np.asarray(x.data, dtype=np.float64).reshape(x.data.shape) for x in rd.tensors}
            attn = m.model.layers[1].self_attn
            q_ok = np.allclose(tens["blk.1.attn_q.weight"], expected_rows(attn.q_proj.weight, NH))
            k_ok = np.allclose(tens["blk.1.attn_k.weight"], expected_rows(attn.k_proj.weight, NKV))
            gap = prefill_gap(m, g, t)
            print(f"{label}:")
            print(f"  config: head_dim {HEAD}, rope_parameters.partial_rotary_factor 0.5 -> rotary width {ROT}"
                  + (f", attn_rotary_emb {are}" if are else ""))
            print(f"  GGUF:   granitehybrid.rope.dimension_count = {n_rot} (expected {ROT})"
                  f"{'' if n_rot == ROT else '  <-- WRONG'}")
            print(f"  GGUF:   blk.1.attn_q/attn_k rows = HF rows with only the rotary {ROT} reordered to adjacent "
                  f"pairs: {q_ok and k_ok}{'' if q_ok and k_ok else '  <-- WRONG (the whole head was permuted)'}")
            if gap is not None:
                print(f"  llama.cpp one-call prefill vs transformers float64: max |d log-prob| = {gap:.3g}")
            bad |= (n_rot != ROT) or not (q_ok and k_ok)
    print("DEFECT PRESENT" if bad else "OK: the GGUF matches the config")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
