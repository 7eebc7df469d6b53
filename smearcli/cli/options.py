"""Options shared by every command (model, device, input, schedules), defined once.

`shared_options` adds these parameters to a command's signature, so Typer shows them in every
command's --help, and hands the command one `RunSpec` instead of fifteen arguments. `RunSpec`
is plain data: building the model and tokens (`cli.build.build_setup`) is where torch gets
imported, so `--help` stays fast.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..util import defaults
from ..gpt.config import PRESETS
from ..util.errors import UserError
from ..util.defaults import ALL_LOGICS, DEFAULT_SCHEDULES, LOGIC_NAMES, PACKED, REFERENCE
from .errors import guarded
from ..engines.registry import REGISTRY  # importing smearcli.engines registers the built-in engines
from .threads import HELP as THREADS_HELP



class ModelKind(str, Enum):
    random = "random"
    tiny = "tiny"


PresetName = Enum("PresetName", {name: name for name in PRESETS}, type=str)  # --preset choices


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class DType(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Logic(str, Enum):
    old = "old"
    fixed = "fixed"
    bosmask = "bosmask"
    both = "both"


class Source(str, Enum):  # the checkpoint sources current nanochat writes (discover.SOURCE_DIRS: also mid)
    base = "base"
    sft = "sft"
    rl = "rl"


M = "Model"
D = "Device"
N = "Whose code (--impl)"
I = "Input"
S = "Schedules"


def check_scope(command: str, check: bool, scope: Optional[str]) -> bool:
    """Whether `--check all` was given (True) or `--check` alone (False): the one word `command`
    takes after its options is `all`, and only after --check."""
    if scope is None:
        return False
    if scope != "all" or not check:
        raise UserError(f"{command} takes no argument: got {scope!r}" + ("; `--check all` fails on known findings too"
                                                                       if scope == "all" else ""))
    return True


def foreign_python(given: Optional[Path], flag: str, env_var: str, needed_by: str, environment: str) -> tuple[str, str]:
    """(the Python of an engine's own environment, where it was given: `flag` or `$env_var`, which
    a refusal of it names). None given and the variable unset: a UserError saying that `needed_by`
    (`--impl vllm`, `--engine llamacpp`) needs `flag` and what `environment` it must be."""
    import os

    if given is not None:
        return str(given), flag
    env = os.environ.get(env_var, "").strip()
    if env:
        return env, f"${env_var}"
    raise UserError(f"{needed_by} needs {flag} PATH (or ${env_var}): the Python of {environment}")


@dataclass
class RunSpec:
    model: Optional[ModelKind] = None  # None: tiny, or random when --depth is given (model_kind)
    checkpoint: Optional[Path] = None
    step: Optional[int] = None
    source: Optional[Source] = None  # with model_tag: discover under --checkpoint or $NANOCHAT_BASE_DIR
    model_tag: Optional[str] = None
    depth: Optional[int] = None  # None: 4 (see depth_value)
    seed: int = 0
    device: Device = Device.auto
    dtype: DType = DType.auto
    seq_len: Optional[int] = None  # None: the preset's, or the sum of --chunk-sizes, or 256 (seq_len_value)
    batch: int = 1
    tokens: Optional[Path] = None
    text: Optional[str] = None
    text_file: Optional[Path] = None
    chat: bool = False
    schedules: str = ",".join(DEFAULT_SCHEDULES)
    logic: Logic = Logic.both
    chunks: Optional[int] = None  # None: defaults.CHUNKS, at most one per token (chunks_for)
    chunk_sizes: Optional[str] = None
    samples: int = defaults.SAMPLES
    gen_len: int = defaults.GEN_LEN
    draft: int = defaults.DRAFT
    reject: int = defaults.REJECT
    documents: Optional[str] = None  # packed: document lengths, "100,60,96" (None: split the input on BOS)
    leak_limit: Optional[float] = None  # packed: what --check gates on
    impl: str = "ours"  # a name in cli.impls.REGISTRY
    nanochat_path: Optional[Path] = None
    hf_model: Optional[str] = None  # --impl hf: a built-in tiny config's name or a model directory
    vllm_python: Optional[Path] = None  # --impl vllm: vLLM's interpreter (else $SMEARCLI_VLLM_PYTHON)
    tensor_parallel_size: int = 1  # --impl vllm: passed to vLLM
    llamacpp_python: Optional[Path] = None  # --impl llamacpp: its interpreter (else $SMEARCLI_LLAMACPP_PYTHON)
    gguf: Optional[Path] = None  # --impl llamacpp: a user's GGUF of --hf-model's model (else converted)
    user_code_timeout: float = defaults.USER_CODE_TIMEOUT
    threads: Optional[int] = None  # None: the rule in smearcli.util.threads
    preset: Optional[PresetName] = None
    quiet: bool = False

    # -- parsing that needs no torch --------------------------------------------------------------
    def schedule_list(self, allow_reference: bool = False) -> list[str]:
        from ..measure.schedules import compare_schedules  # the registry: a schedule registered at run time is known too

        known = compare_schedules()  # not the census's own combinations, imported or not
        names = [s.strip() for s in self.schedules.split(",") if s.strip()]
        if not names:
            raise UserError("--schedules is empty; choose from " + ", ".join(known))
        for n in names:
            if n not in known:
                raise UserError(f"--schedules: unknown schedule {n!r}; choose from {', '.join(known)}")
            if n == REFERENCE and not allow_reference:
                raise UserError(f"--schedules: '{REFERENCE}' is the reference every run is compared with; leave it out")
        return list(dict.fromkeys(names))

    def model_kind(self) -> ModelKind:
        """The built-in model to run: as given, else random when --depth sizes one, else tiny."""
        if self.preset is not None:
            if self.checkpoint is not None:
                raise UserError(f"--preset {self.preset.value} sizes a random model; leave it out with --checkpoint")
            if self.model == ModelKind.tiny:
                raise UserError(f"--preset {self.preset.value} sizes a random model; leave it out with --model tiny")
            return ModelKind.random
        if self.model is not None:
            if self.model == ModelKind.tiny and self.depth is not None:
                raise UserError("--depth sizes the random model; use it with --model random, not --model tiny")
            return self.model
        return ModelKind.random if self.depth is not None else ModelKind.tiny

    def discovers(self) -> bool:
        """A nanochat checkpoint is to be found (--checkpoint, --source or --model-tag given)."""
        return self.checkpoint is not None or self.source is not None or self.model_tag is not None

    def depth_value(self) -> int:
        return 4 if self.depth is None else self.depth

    def logic_list(self, schedules: Optional[list[str]] = None) -> list[str]:
        """The logics to run: `both` is old and fixed, and with the packed schedule also bosmask;
        `schedules`: the parsed --schedules, where the caller has them (else parsed here)."""
        if self.logic != Logic.both:
            return [self.logic.value]
        return list(ALL_LOGICS) if PACKED in (schedules or self.schedule_list()) else list(LOGIC_NAMES)

    def document_lengths(self) -> Optional[tuple[int, ...]]:
        if self.documents is None:
            return None
        try:
            sizes = tuple(int(s) for s in self.documents.split(","))
        except ValueError:
            raise UserError(f"--documents: expected comma-separated document lengths like 100,60,96, "
                            f"got {self.documents!r}") from None
        if any(n < 1 for n in sizes):
            raise UserError(f"--documents: every document needs at least one token (its BOS), got {self.documents}")
        return sizes

    def chunk_size_tuple(self) -> Optional[tuple[int, ...]]:
        if self.chunk_sizes is None:
            return None
        try:
            sizes = tuple(int(s) for s in self.chunk_sizes.split(","))
        except ValueError:
            raise UserError(f"--chunk-sizes: expected comma-separated integers like 100,60,1,159, "
                            f"got {self.chunk_sizes!r}") from None
        return sizes

    def seq_len_value(self) -> int:
        """Random input's length: as given, else the sum of --chunk-sizes, else the preset's, else 256."""
        if self.seq_len is not None:
            return self.seq_len
        sizes = self.chunk_size_tuple() or self.document_lengths()
        if sizes:
            return sum(sizes)
        return PRESETS[self.preset.value].seq_len if self.preset is not None else 256

    def chunks_for(self, T: int) -> int:
        """--chunks as given, else the default capped at one chunk per token (a short --text)."""
        return self.chunks if self.chunks is not None else min(defaults.CHUNKS, max(T, 1))

    def check_impl(self) -> None:
        """The option checks every implementation shares (the registry, cli.impls, checks which
        options an implementation needs, owns or refuses)."""
        if not 0 < self.user_code_timeout <= 1e6:  # also refuses nan and inf
            raise UserError(f"--user-code-timeout must be a number of seconds in (0, 1e6], got {self.user_code_timeout}")


# One Annotated type per shared option: the single definition of its flag, help and panel.
SHARED = {
    "model": (Optional[ModelKind], typer.Option("--model", help="Built-in model to run when no --checkpoint is "
              "given. 'tiny' (the default): the small byte-level model trained by examples/train_tiny.py that "
              "ships with smearcli; 'random': seeded random weights with non-zero smear (see --depth, --seed), "
              "the default when --depth is given.", rich_help_panel=M, show_default=False)),
    "checkpoint": (Optional[Path], typer.Option("--checkpoint", help="A nanochat checkpoint: a directory "
                   "with model_XXXXXX.pt + meta_XXXXXX.json, a *_checkpoints directory (the largest dN tag is "
                   "picked), or a nanochat base directory (see --source, --model-tag). Loaded with "
                   "weights_only=True: a file that would need arbitrary unpickling, which can run code, is "
                   "refused.", rich_help_panel=M)),
    "source": (Optional[Source], typer.Option("--source", help="Which checkpoints of a nanochat base directory: "
               "base, sft or rl (default: the first present of sft, rl, base). Without --checkpoint the base "
               "directory is $NANOCHAT_BASE_DIR (default ~/.cache/nanochat).", rich_help_panel=M,
               show_default=False)),
    "model_tag": (Optional[str], typer.Option("--model-tag", help="Model tag folder, e.g. d20 (default: the "
                  "largest dN). Without --checkpoint, looked for under $NANOCHAT_BASE_DIR.", rich_help_panel=M)),
    "step": (Optional[int], typer.Option("--step", help="Checkpoint step to load (default: the newest).", rich_help_panel=M)),
    "depth": (Optional[int], typer.Option("--depth", help="Layers of the random model (default 4; giving it "
              "selects --model random). nanochat's sizing rule: width 64 x depth rounded up to heads of 128 "
              "dims (--depth 5: 384 wide, 3 heads), one kv head per head. Alone: the small preset at this "
              "depth, a byte vocabulary (256) and context 512, seconds on a CPU, not nanochat's real "
              "models (see --preset). With --preset: that preset's vocabulary and context at this depth.",
              rich_help_panel=M, show_default=False)),
    "seed": (int, typer.Option("--seed", help="Seed for the random model's weights and the random input.", rich_help_panel=M)),
    "device": (Device, typer.Option("--device", help="Where to run; auto picks cuda, then mps, then cpu.", rich_help_panel=D)),
    "dtype": (DType, typer.Option("--dtype", help="Compute dtype: auto, float32, bfloat16 or float16; auto "
              "is bfloat16 on CUDA (as nanochat) and float32 elsewhere.", rich_help_panel=D, metavar="<dtype>")),
    "seq_len": (Optional[int], typer.Option("--seq-len", help="Tokens per row of random input (default 256, "
                "the preset's, or the sum of --chunk-sizes).", rich_help_panel=I, show_default=False)),
    "batch": (int, typer.Option("--batch", help="Rows of random input.", rich_help_panel=I)),
    "tokens": (Optional[Path], typer.Option("--tokens", help="Input ids instead of random ones: a JSON list "
               "of ids (or one list per row), or a tensor saved with torch.save.", rich_help_panel=I)),
    "text": (Optional[str], typer.Option("--text", help="Input text. A byte-level model (vocabulary 256, like "
             "--model tiny) takes its UTF-8 bytes as ids; a BPE checkpoint's tokenizer.pkl (beside the "
             "weights or in <base>/tokenizer/; read without running code from it; needs pip install "
             "'smearcli[text]') encodes it after <|bos|>. With --schedules packed, the text <|bos|> splits it "
             "into documents there, each one after the BOS id (as nanochat's tokenizer writes a packed row; byte "
             "0 stands in for BOS in a byte-level model); elsewhere <|bos|> is ordinary text.", rich_help_panel=I)),
    "text_file": (Optional[Path], typer.Option("--text-file", help="Like --text, from a file (its bytes as "
                  "they are; UTF-8 text for a BPE checkpoint).", rich_help_panel=I)),
    "chat": (bool, typer.Option("--chat", help="Read --text/--text-file as a chat: a JSON list of turns, "
             "strings alternating user and assistant (or {\"role\": ..., \"content\": ...} objects), "
             "rendered with nanochat's chat tokens; the chunked schedule then feeds one chunk per turn, "
             "reusing the cache across turns as a serving stack does (unless --chunks or --chunk-sizes is "
             "given).", rich_help_panel=I)),
    "schedules": (str, typer.Option("--schedules", help="Comma-separated schedules to run against the full "
                  "forward pass: " + ", ".join(DEFAULT_SCHEDULES) + " (default: all; bench: prefill,chunked,decode).",
                  rich_help_panel=S, show_default=False)),
    "logic": (Logic, typer.Option("--logic", help="Smear logic: old (upstream, with the #756 bug), fixed, bosmask (fixed, no smear where the "
              "token is BOS), or both (old and fixed; with --schedules packed also bosmask).", rich_help_panel=S)),
    "chunks": (Optional[int], typer.Option("--chunks", help="chunked: split the sequence into N near-equal "
               "chunks (default 4, at most one per token).", rich_help_panel=S, show_default=False)),
    "chunk_sizes": (Optional[str], typer.Option("--chunk-sizes", help="chunked: explicit sizes, e.g. "
                    "100,60,1,159 (sets --seq-len when it is not given; overrides --chunks).", rich_help_panel=S)),
    "samples": (int, typer.Option("--samples", help="engine: rows the batch-1 prefill is expanded to.", rich_help_panel=S)),
    "gen_len": (int, typer.Option("--gen-len", help="engine, speculative: tokens after the prompt "
                "(decoded one by one, or verified --draft at a time).", rich_help_panel=S)),
    "draft": (int, typer.Option("--draft", help="speculative, rollback: tokens per verify step.", rich_help_panel=S)),
    "reject": (int, typer.Option("--reject", help="rollback: tokens of each draft rejected and taken back "
               "out of the cache (fewer than --draft).", rich_help_panel=S)),
    "documents": (Optional[str], typer.Option("--documents", help="packed: the lengths of the documents "
                  "packed in one row, e.g. 100,60,96 (sets --seq-len; BOS is written at each start). "
                  "A --text input is split at each <|bos|> marker in it (given both, they must agree); "
                  "without --documents, a --tokens input is split at each BOS. --logic both then runs old, "
                  "fixed and bosmask (no smear at BOS).", rich_help_panel=S, show_default=False)),
    "leak_limit": (Optional[float], typer.Option("--leak-limit", help="packed: with --check, exit 1 when "
                   "any document's first tokens leak more than this max |Δlogit| (a leak is a measurement "
                   "of training against inference, not a bug, so the limit is yours).", rich_help_panel=S,
                   show_default=False)),
    "impl": (str, typer.Option("--impl", rich_help_panel=N, metavar="NAME")),  # its help: below, once flags are known
    "nanochat_path": (Optional[Path], typer.Option("--nanochat-path", help="A nanochat checkout (the "
                      "directory holding nanochat/gpt.py and nanochat/engine.py) for --impl nanochat|both. "
                      "Imported in isolation, never written to; SDPA attention is forced.", rich_help_panel=N)),
    "hf_model": (Optional[str], typer.Option("--hf-model", help="For --impl hf: a built-in tiny random "
                 "config (llama, gemma3, mamba, mamba2, zamba2) or a local Hugging Face model directory "
                 "(loaded offline, safetensors only); for --impl vllm: a local model directory. Needs transformers: pip install 'smearcli[hf]'.",
                 rich_help_panel=N, show_default=False)),
    "vllm_python": (Optional[Path], typer.Option("--vllm-python", metavar="PATH", help="For --impl vllm: the "
                    "Python interpreter of an environment with vLLM (scripts/make_env.sh vllm DIR makes one; "
                    "then DIR/bin/python). Default: $SMEARCLI_VLLM_PYTHON.", rich_help_panel=N,
                    show_default=False)),
    "tensor_parallel_size": (int, typer.Option("--tensor-parallel-size", metavar="N", help="For --impl vllm on "
                             "a GPU machine (with --device cuda): vLLM's tensor parallelism over N GPUs. "
                             "Passed through; the CPU backend runs 1.", rich_help_panel=N)),
    "llamacpp_python": (Optional[Path], typer.Option("--llamacpp-python", metavar="PATH", help="For --impl "
                        "llamacpp: the Python interpreter of an environment with llama-cpp-python "
                        "(scripts/make_env.sh llamacpp DIR makes one; then DIR/bin/python). Default: "
                        "$SMEARCLI_LLAMACPP_PYTHON.", rich_help_panel=N, show_default=False)),
    "gguf": (Optional[Path], typer.Option("--gguf", metavar="FILE", help="For --impl llamacpp: your own GGUF "
             "of the --hf-model model, loaded instead of converting it (its header is checked first).",
             rich_help_panel=N, show_default=False)),
    "user_code_timeout": (float, typer.Option("--user-code-timeout", metavar="SECONDS", help="With --impl "
                          "nanochat|both: the most seconds each call into your checkout's code may take (its "
                          "import, building its model, one forward pass); past it the run stops with exit "
                          "status 1. Enforced with SIGALRM on POSIX (main thread); elsewhere no limit.",
                          rich_help_panel=N)),
    "threads": (Optional[int], typer.Option("--threads", help=THREADS_HELP, rich_help_panel=D, show_default=False)),
    "preset": (Optional[PresetName], typer.Option("--preset", help="A random model of a named shape: "
               + "; ".join(p.describe() for p in PRESETS.values()) + ". The d-presets are nanochat's real "
               "models (width 64 x depth rounded to 128-dim heads, kv heads = heads, 65,536-token vocabulary, "
               "context and input 2048). --depth and --seq-len override it.", rich_help_panel=M,
               show_default=False)),
    "quiet": (bool, typer.Option("--quiet", "-q", help="No progress bar (one is drawn on stderr only "
              "when it is a terminal).")),
}
_DEFAULTS = RunSpec()
assert set(SHARED) == {f.name for f in fields(RunSpec)}


def flag_of(field: str) -> str:
    """The command-line flag of a RunSpec field ("hf_model" -> "--hf-model")."""
    opt = SHARED[field][1]
    return (opt.param_decls or (opt.default,))[0]  # typer keeps the first flag as `default` under Annotated


def said(impl, text: str) -> str:
    """A registration's text (`engines.registry`) as the user reads it: each `{field}` the option's
    flag, `{this}` the implementation's own `--impl NAME`."""
    return text.format_map({**{f: flag_of(f) for f in SHARED}, "this": f"{flag_of('impl')} {impl.name}"})


SHARED["impl"][1].help = "Whose code runs the model: " + "; ".join(
    f"{i.name}: {said(i, i.help)}" for i in REGISTRY.values()) + "."


def shared_options(fn):
    """Give `fn(spec: RunSpec, ...own options)` every shared option on the command line."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)  # resolve string annotations
    own = [p.replace(annotation=hints.get(name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
           for name, p in sig.parameters.items() if name != "spec"]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                               default=getattr(_DEFAULTS, name), annotation=Annotated[tp, opt])
             for name, (tp, opt) in SHARED.items()]

    @functools.wraps(fn)
    @guarded
    def wrapper(**kwargs):
        spec = RunSpec(**{k: kwargs.pop(k) for k in SHARED})
        return fn(spec, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=extra + own, return_annotation=None)
    return wrapper
