"""Reproducer: convert_hf_to_gguf (conversion/mellum.py, MellumModel.set_gguf_parameters) writes
{arch}.attention.sliding_window whenever config.json has "sliding_window" and
"use_sliding_window" is not False, even when no layer is "sliding_attention"; the GGUF then
declares a window with an all-false sliding pattern, src/models/mellum.cpp takes
LLAMA_SWA_TYPE_STANDARD from n_swa > 0 alone, and creating a context aborts with
GGML_ASSERT(hparams.is_swa_any()) (src/llama-model.cpp, create_memory).

Run with llama.cpp's converter environment:
    $SMEARCLI_LLAMACPP_PYTHON mellum_repro.py [--with-suggested-fix]

Builds a tiny random MellumForCausalLM with transformers, config left at MellumConfig's defaults
for the attention layout (layer_types all "full_attention", sliding_window 1024), converts it with
the converter's own class (only set_vocab replaced: no tokenizer), prints the GGUF's sliding-window
keys against config.json, then loads it in llama.cpp (in a child process, which the assert kills)
and compares one prefill with transformers (float64).

Exit 1 while the defect is there (the GGUF declares a window no layer uses, or llama.cpp aborts),
0 once fixed, 2 if it cannot run.
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


def build(d: Path):
    cfg = transformers.MellumConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                    max_position_embeddings=256)
    torch.manual_seed(0)
    m = transformers.MellumForCausalLM(cfg)
    m.save_pretrained(d)
    return m, json.loads((d / "config.json").read_text())


def convert(d: Path, out: Path):
    cls = get_model_class(get_model_architecture(ModelBase.load_hparams(d, False), ModelType.TEXT), mmproj=False)

    class NoVocab(cls):
        model_arch = cls.model_arch

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")
            self.gguf_writer.add_vocab_size(int(self.hparams["vocab_size"]))

        if FIX:  # the suggested fix, applied here only: no window when no layer slides
            def set_gguf_parameters(self):
                if "sliding_attention" not in (self.hparams.get("layer_types") or []):
                    self.hparams["use_sliding_window"] = False
                super().set_gguf_parameters()

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


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mellum-repro-") as t:
        t = Path(t)
        d, g = t / "m", t / "m.gguf"
        try:
            m, cfg = build(d)
            convert(d, g)
            f = gguf.GGUFReader(str(g)).fields
        except Exception as e:  # noqa: BLE001
            print(f"cannot run: {type(e).__name__}: {e}")
            return 2
        win = f["mellum.attention.sliding_window"].contents() if "mellum.attention.sliding_window" in f else None
        pat = (f["mellum.attention.sliding_window_pattern"].contents()
               if "mellum.attention.sliding_window_pattern" in f else None)
        print(f"config: sliding_window = {cfg.get('sliding_window')}, use_sliding_window = "
              f"{cfg.get('use_sliding_window', '(absent)')}, layer_types = {cfg['layer_types']}")
        print(f"GGUF:   mellum.attention.sliding_window = {win}, mellum.attention.sliding_window_pattern = {pat}")
        declared_unused = win is not None and pat is not None and not any(pat)
        if declared_unused:
            print("  <-- WRONG: a sliding window is declared but no layer slides")

        toks = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
        npy = t / "ll.npy"
        r = subprocess.run([sys.executable, "-c", PREFILL, str(g), json.dumps(toks[0].tolist()), str(npy)],
                           capture_output=True, text=True)
        aborted = r.returncode != 0
        if aborted:
            last = [ln for ln in (r.stderr or "").splitlines() if "GGML_ASSERT" in ln or "error" in ln.lower()]
            print(f"llama.cpp: the child died (return code {r.returncode}): {last[-1] if last else r.stderr[-300:]}")
        else:
            ll = np.load(npy)
            m64 = m.double()
            if hasattr(m64, "set_experts_implementation"):
                m64.set_experts_implementation("eager")  # grouped matrix multiplication refuses float64
            with torch.no_grad():
                ref = torch.log_softmax(m64(toks).logits[0], -1).numpy()
            ll = ll - ll.max(-1, keepdims=True)
            ll = ll - np.log(np.exp(ll).sum(-1, keepdims=True))
            print(f"llama.cpp one-call prefill vs transformers float64: max |d log-prob| = {np.abs(ll - ref).max():.3g}")
    bad = declared_unused or aborted
    print("DEFECT PRESENT" if bad else "OK: no window declared without a sliding layer, and llama.cpp runs it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
