"""Reproducer: convert_hf_to_gguf converts transformers-format GLM (GlmForCausalLM, model_type
"glm", e.g. zai-org/glm-4-9b-chat-hf) through ChatGLMModel, which reads the keys of the
remote-code ChatGLM config.json, not the transformers ones:
  - RMSNorm epsilon from "layernorm_epsilon" (absent) -> default 1e-5, not "rms_norm_eps";
  - RoPE base hard-coded 10000 (* "rope_ratio", absent), not rope_parameters.rope_theta;
  - context length from "seq_length" (absent) -> hidden_size, not max_position_embeddings.

Run with llama.cpp's converter environment:
    $SMEARCLI_LLAMACPP_PYTHON glm_repro.py [--with-suggested-fix]

Builds a tiny random GlmForCausalLM with transformers (GlmConfig's own defaults for
rms_norm_eps = 1.5625e-07 and rope_theta = 10000, which glm-4-9b(-chat)-hf also use; a second
model with rope_theta 500000 for the RoPE base), converts it with the converter's own class (only
set_vocab replaced: no tokenizer), and compares the GGUF's keys with config.json. Also prints
llama.cpp's one-call prefill against transformers (float64) as evidence.

Exit 1 while the defect is there, 0 once fixed, 2 if it cannot run.
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


def build(d: Path, rope_theta: float):
    cfg = transformers.GlmConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                                 rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                                  "partial_rotary_factor": 0.5})
    torch.manual_seed(0)
    m = transformers.GlmForCausalLM(cfg)
    m.save_pretrained(d)
    return m, json.loads((d / "config.json").read_text())


def convert(d: Path, out: Path):
    cls = get_model_class(get_model_architecture(ModelBase.load_hparams(d, False), ModelType.TEXT), mmproj=False)

    class NoVocab(cls):
        model_arch = cls.model_arch

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")
            self.gguf_writer.add_vocab_size(int(self.hparams["vocab_size"]))

        if FIX:  # the suggested fix (read the transformers keys when present), applied here only
            def set_gguf_parameters(self):
                super().set_gguf_parameters()
                h = self.hparams
                if "rms_norm_eps" in h and "layernorm_epsilon" not in h:
                    self.gguf_writer.add_layer_norm_rms_eps(h["rms_norm_eps"])
                if "rope_ratio" not in h and (theta := self.rope_parameters.get("rope_theta")) is not None:
                    self.gguf_writer.add_rope_freq_base(theta)
                if "seq_length" not in h and "max_position_embeddings" in h:
                    self.gguf_writer.add_context_length(h["max_position_embeddings"])

    import logging
    logging.disable(logging.WARNING)
    with torch.inference_mode():
        NoVocab(d, gguf.LlamaFileType.ALL_F32, out, eager=True).write()


PREFILL = r"""
import sys, json, numpy as np, llama_cpp
g, toks = sys.argv[1], json.loads(sys.argv[2])
llm = llama_cpp.Llama(model_path=g, n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, verbose=False, n_threads=1,
                      n_threads_batch=1, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
llm.eval(toks)
np.save(sys.argv[3], np.array(llm.scores[:len(toks)], dtype=np.float64))
"""


def prefill_gap(m, g: Path, tmp: Path):
    toks = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
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
    os.remove(npy)
    return float(np.abs(ll - ref).max())


def main() -> int:
    bad = False
    with tempfile.TemporaryDirectory(prefix="glm-repro-") as t:
        t = Path(t)
        for theta in (10000.0, 500000.0):
            d = t / f"glm{int(theta)}"
            try:
                m, cfg = build(d, theta)
                g = t / f"glm{int(theta)}.gguf"
                convert(d, g)
                f = gguf.GGUFReader(str(g)).fields
            except Exception as e:  # noqa: BLE001
                print(f"cannot run: {type(e).__name__}: {e}")
                return 2
            eps = float(f["chatglm.attention.layer_norm_rms_epsilon"].contents())
            base = float(f["chatglm.rope.freq_base"].contents())
            ctx = int(f["chatglm.context_length"].contents())
            checks = [
                ("chatglm.attention.layer_norm_rms_epsilon", eps, "rms_norm_eps", cfg["rms_norm_eps"],
                 np.float32(eps) == np.float32(cfg["rms_norm_eps"])),
                ("chatglm.rope.freq_base", base, "rope_parameters.rope_theta", cfg["rope_parameters"]["rope_theta"],
                 np.float32(base) == np.float32(cfg["rope_parameters"]["rope_theta"])),
                ("chatglm.context_length", ctx, "max_position_embeddings", cfg["max_position_embeddings"],
                 ctx == cfg["max_position_embeddings"]),
            ]
            print(f"GlmForCausalLM, rope_theta {theta:g}:")
            for key, got, ckey, want, ok in checks:
                print(f"  GGUF {key} = {got:g}   config {ckey} = {want:g}{'' if ok else '  <-- WRONG'}")
                bad |= not ok
            gap = prefill_gap(m, g, t)
            if gap is not None:
                print(f"  llama.cpp one-call prefill vs transformers float64: max |d log-prob| = {gap:.3g}")
    print("DEFECT PRESENT" if bad else "OK: the GGUF matches the config")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
