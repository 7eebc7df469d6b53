"""The llama.cpp worker's conversion of a Hugging Face model directory to GGUF (`worker.py` imports
it as a sibling module; like the worker, it runs in llama.cpp's environment and never imports
smearcli). llama.cpp's own converter does the work: its `conversion` package, copied by
scripts/make_env.sh llamacpp into the environment's share/llamacpp-convert, imported by its path.
The one change: the vocabulary is written in the vocabulary-less form (tokenizer model "none" and
`{arch}.vocab_size` entries, which llama.cpp loads as that many dummy tokens), since smearcli's tiny
random models have no tokenizer and the question is the cache, not the tokenizer.
"""

import os
import sys
import time


def converter_dir() -> str:
    return os.path.join(sys.prefix, "share", "llamacpp-convert")


def load_conversion():
    """llama.cpp's `conversion` package from the converter's directory, imported by its path (the
    worker's own directory stays first on the import path, nothing else is added to it)."""
    import importlib.util

    if "conversion" in sys.modules:
        return sys.modules["conversion"]
    pkg = os.path.join(converter_dir(), "conversion")
    spec = importlib.util.spec_from_file_location("conversion", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    module = importlib.util.module_from_spec(spec)
    sys.modules["conversion"] = module
    spec.loader.exec_module(module)
    return module


def registered() -> list:
    """Every Hugging Face architecture name the converter registers for a text model (its
    `TEXT_MODEL_MAP`, read without importing the model modules), sorted."""
    return sorted(load_conversion().TEXT_MODEL_MAP)


def load_models() -> None:
    """Import what a conversion needs, every model module of the converter included (the fork
    server's one-time cost: the workers it forks find them imported). A module that fails to
    import is left for the conversion that needs it to report."""
    import gguf  # noqa: F401
    import torch  # noqa: F401
    import transformers.activations  # noqa: F401 - what every config class imports (a second of the first)
    import transformers.configuration_utils  # noqa: F401

    conversion = load_conversion()
    for module in sorted(set(conversion.TEXT_MODEL_MAP.values())):
        try:
            __import__(f"conversion.{module}")
        except Exception:
            pass


def absolute_positions(path: str) -> bool:
    """Whether the GGUF adds a learned embedding of each absolute position (`position_embd`): such a
    model's cache holds hidden states computed at their positions, which no shift can move."""
    import gguf

    return any(t.name == "position_embd.weight" for t in gguf.GGUFReader(path).tensors)


def gguf_arch(model_dir: str) -> tuple:
    """(the converter's class for the config's architecture, its GGUF architecture name)."""
    import gguf

    conversion = load_conversion()
    ModelBase, ModelType = conversion.ModelBase, conversion.ModelType
    get_model_architecture, get_model_class = conversion.get_model_architecture, conversion.get_model_class

    hparams = ModelBase.load_hparams(__import__("pathlib").Path(model_dir), False)
    arch = get_model_architecture(hparams, ModelType.TEXT)
    cls = get_model_class(arch, mmproj=False)
    return cls, gguf.MODEL_ARCH_NAMES[cls.model_arch]


def convert(model_dir: str, out: str) -> dict:
    """The model directory as a float32 GGUF at `out`, its vocabulary replaced by `vocab_size`
    dummy tokens (tokenizer model "none", which llama.cpp loads as that many tokens)."""
    from pathlib import Path

    import gguf
    import torch

    cls, name = gguf_arch(model_dir)

    class NoVocab(cls):
        model_arch = cls.model_arch  # the converter asks every subclass to name it

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")
            self.gguf_writer.add_vocab_size(int(self.hparams["vocab_size"]))

    t = time.time()
    with torch.inference_mode():
        m = NoVocab(Path(model_dir), gguf.LlamaFileType.ALL_F32, Path(out + ".part"), eager=True)
        m.write()
    os.replace(out + ".part", out)
    return {"arch": name, "convert_s": round(time.time() - t, 2), "bytes": os.path.getsize(out)}
