"""Turn a `RunSpec` (parsed options) into a model, input tokens and schedule options.

The only place that maps a library error to a flag: the library names files and problems, this
module says which option they came from."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from ..util.allocator import keep_freed
from ..gpt.config import ConfigError
from ..util.errors import UserError
from ..measure.inputs import load_tokens, random_tokens, read_text_bytes, read_text_file, text_documents, text_tokens
from ..util.preflight import TooLarge, check_dtype, check_run_memory
from ..measure.steps import ScheduleOptions, chunk_plan
from ..gpt.checkpoint import NoSmearParameters, NoSuchStep, find_step
from ..gpt.config import preset_config
from ..gpt.weights import LoadedModel, load_checkpoint, random_config, random_model, tiny_model
from ..util import defaults
from ..measure import profile
from .errors import PROGRAM
from .options import Device, DType, ModelKind, RunSpec
from .threads import apply_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Setup:
    loaded: LoadedModel
    tokens: torch.Tensor  # (B, T) int64 on the model's device
    options: ScheduleOptions
    schedules: list[str]
    logics: list[str]
    impl: str = "ours"  # whose code runs: ours, nanochat (the user's checkout) or both
    audited: object = None  # with --impl nanochat|both: the user's model (adapter.NanochatModel)
    found: object = None  # the discovered checkpoint (discover.Discovered), if one was loaded
    threads: str = ""  # the footer line: "threads: 1 (load 3.2 on 2 cores)"

    @property
    def model(self):
        return self.loaded.model


def resolve_device(name: str) -> torch.device:
    if name == Device.auto:
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == Device.cuda and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available on this machine (try --device cpu)")
    if name == Device.mps and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError("--device mps: MPS is not available on this machine (try --device cpu)")
    return torch.device(name.value if isinstance(name, Device) else name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    name = name.value if isinstance(name, DType) else name
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def preflight(cfg, device, dtype, B: int, T: int, schedules, logics, spec: RunSpec, chunk_sizes,
              kept: bool = False) -> None:
    """Before any input is generated or any run starts: positions and memory (`kept`: this process
    keeps the memory it frees, `allocator.keep_freed`)."""
    if T < 2 and {"engine", "speculative"} & set(schedules):
        raise UserError(f"the input has {T} token; the engine and speculative schedules need at least 2")
    if T > cfg.rotary_len:
        raise UserError(f"{T} tokens exceed what the model's rotary table covers ({cfg.rotary_len} = "
                        f"10 x sequence_len {cfg.sequence_len})")
    max_chunk = max(chunk_sizes) if chunk_sizes else -(-T // max(spec.chunks_for(T), 1))
    check_run_memory(cfg, device, B, T, schedules, logics, max(spec.samples, 1), max_chunk, dtype,
                     hint="lower --seq-len, --batch or --samples, or run fewer --schedules", kept=kept)


def _check_plan(T: int, schedules, opts: ScheduleOptions) -> None:
    if "chunked" in schedules:
        try:
            chunk_plan(T, opts)
        except ValueError as e:
            if opts.chunk_sizes:
                raise UserError(f"--chunk-sizes: {e}") from e
            hint = f"; give --chunks {T} or fewer, or a longer input" if opts.chunks > T else ""
            raise UserError(f"--chunks {opts.chunks}: {e}{hint}") from e


def check_arguments(spec: RunSpec, schedules, chunk_sizes) -> ScheduleOptions:
    """Everything the options alone decide, checked before a model is built or loaded."""
    inputs = [f for f, v in (("--tokens", spec.tokens), ("--text", spec.text), ("--text-file", spec.text_file))
              if v is not None]
    if len(inputs) > 1:
        raise UserError(f"{' and '.join(inputs)}: give only one of them")
    if spec.step is not None and not spec.discovers():
        raise UserError("--step needs --checkpoint (or --source / --model-tag)")
    if spec.chat and spec.text is None and spec.text_file is None:
        raise UserError("--chat reads the conversation from --text or --text-file; give one of them")
    if not 0 <= spec.seed < 2**64:
        raise UserError(f"--seed must be between 0 and 2^64 - 1, got {spec.seed}")
    T = spec.seq_len_value() if not inputs else None  # random input: its length is known now
    opts = ScheduleOptions(chunks=spec.chunks_for(T or defaults.CHUNKS), chunk_sizes=chunk_sizes, samples=spec.samples,
                           gen_len=spec.gen_len, draft=spec.draft)
    for name, value in (("--samples", spec.samples), ("--gen-len", spec.gen_len), ("--draft", spec.draft),
                        ("--reject", spec.reject)):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if "rollback" in schedules and spec.reject >= spec.draft:
        raise UserError(f"--reject {spec.reject} with --draft {spec.draft}: rollback rejects 1 to {spec.draft - 1} "
                        f"tokens of each draft (fewer than --draft), so the cache has something to keep")
    if spec.reject != defaults.REJECT and "rollback" not in schedules:  # else ignored without a word
        raise UserError("--reject sizes the rollback schedule; add --schedules rollback")
    _check_leak_limit(spec)
    opts = replace(opts, reject=spec.reject, documents=spec.document_lengths())
    if T is not None:
        if T < 2:
            raise UserError(f"--seq-len must be >= 2, got {T}")
        if spec.batch < 1:
            raise UserError(f"--batch must be >= 1, got {spec.batch}")
        _check_plan(T, schedules, opts)
        check_boundaries(T, schedules, opts, draft_given=spec.draft != defaults.DRAFT)
    return opts


def _check_leak_limit(spec: RunSpec) -> None:
    if spec.leak_limit is not None and not 0 <= spec.leak_limit < float("inf"):  # before any model loads
        raise UserError(f"--leak-limit must be a finite number >= 0, got {spec.leak_limit}")


def check_boundaries(T: int, schedules, opts: ScheduleOptions, draft_given: bool = True) -> None:
    """The boundaries rollback, speculative and packed cross, against a T-token input: refused with
    the numbers when they cannot be formed, or would never be crossed (a --check over a boundary
    that never happened would pass without having checked it). `draft_given`: --draft was on the
    command line (the default 4 may be longer than a short text's tokens; speculative then
    verifies them in one step, as asked of no one)."""
    verified = min(opts.gen_len, T - 1)  # the tokens after the prompt, fed a draft at a time
    source = (f"--gen-len {opts.gen_len} of a {T}-token input" if opts.gen_len < T - 1
              else f"all but the first of a {T}-token input")
    if "rollback" in schedules and verified < opts.draft:
        raise UserError(f"--schedules rollback: no draft would ever be taken back: the {verified} "
                        f"token{'s' if verified != 1 else ''} verified after the prompt ({source}) are fewer than one --draft of {opts.draft}; give "
                        + (f"--draft {verified} or less, or " if verified >= 2 else "") + "a longer --gen-len or input")
    if "speculative" in schedules and draft_given and opts.draft > verified:
        raise UserError(f"--draft {opts.draft}: longer than the {verified} tokens verified after the prompt "
                        f"({source}); give --draft {verified} or less")
    if "packed" in schedules and opts.documents is not None:
        docs = ",".join(map(str, opts.documents))
        if sum(opts.documents) != T:
            raise UserError(f"--documents {docs}: the lengths sum to {sum(opts.documents)} but the input has "
                            f"{T} tokens")
        if len(opts.documents) < 2:
            raise UserError(f"--documents {docs}: one document, so no boundary between documents is ever "
                            "crossed; give two or more lengths")


@contextlib.contextmanager
def flag(name: str, sep: str = " "):
    """Prefix a library's UserError with the option whose value it is about: `--tokens` before
    "t.json: file not found", `--text` + ": " before "the text is empty"."""
    try:
        yield
    except UserError as e:
        raise UserError(f"{name}{sep}{e}") from e


def attach(spec: RunSpec, loaded, device, dtype, found=None):
    """The step for --impl nanochat|both: import the user's code and build their model, from our
    model's weights (random, tiny) or from --checkpoint the way upstream loads it.

    Returns (loaded, audited, logics): with --impl nanochat, `loaded` wraps the user's model and
    the one logic is theirs; with --impl both, `loaded` stays ours and runs old and fixed."""
    from ..engines.nanochat.adapter import nanochat_from_checkpoint, nanochat_from_model
    from ..engines.nanochat.adapter import USER_LOGIC
    from ..engines.nanochat.sandbox import import_nanochat
    from ..util.defaults import LOGIC_NAMES

    impl = getattr(spec.impl, "value", spec.impl)
    code = import_nanochat(spec.nanochat_path, dtype=dtype, timeout=spec.user_code_timeout)
    if found is not None:
        theirs, step, meta = nanochat_from_checkpoint(code, found.leaf, found.step, device)
        source = str(found.leaf)
    else:
        theirs = nanochat_from_model(code, loaded.model)
        source, step, meta = loaded.source, loaded.step, loaded.meta
    if impl == "nanochat":
        return LoadedModel(theirs, source, step, meta), theirs, [USER_LOGIC]
    return loaded, theirs, list(LOGIC_NAMES)


def build_setup(spec: RunSpec, sequence_len: int = 512, schedules: Optional[list[str]] = None,
                float64: bool = False, keep_memory: bool = False) -> Setup:
    """`sequence_len`: the random model's training context (windows, rotary table) without
    --preset (a preset brings its own); `schedules`: --schedules as the command parsed it for the
    implementation (`cli.impls.schedules_for`), parsed here only where no command did. The
    options `cli.impls.implementation` checked (`RunSpec.check_impl`) are not checked again.
    `float64`: the command will ask for the model's float64 copy (a comparison's floor), which a
    random model then makes while its weights are drawn (`weights.init_random`). `keep_memory`:
    the smearcli program keeps what each forward frees for the next (`allocator.keep_freed`; a
    comparison asks for it, not `bench`, whose peak-memory column reads the process's growth)."""
    if spec.preset is not None:
        spec.model_kind()  # --preset with --checkpoint / --model tiny: refused before anything loads
    schedules = list(schedules) if schedules is not None else spec.schedule_list()
    logics = spec.logic_list(schedules)
    chunk_sizes = spec.chunk_size_tuple()
    impl = getattr(spec.impl, "value", spec.impl)
    opts = check_arguments(spec, schedules, chunk_sizes)
    threads = apply_threads(spec.threads)
    device = resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    with flag("--dtype"):
        check_dtype(device, dtype)
    # one model in this process: each forward reuses the memory the last one freed
    kept = keep_memory and PROGRAM["own_process"] and keep_freed()
    with profile.section("build"):
        loaded, audited, logics, found = _build_models(spec, impl, logics, device, dtype, sequence_len, float64)
    for m in (loaded.model, audited):  # --profile: each forward is timed (a no-op otherwise)
        if m is not None:
            profile.watch_forwards(m)
    cfg = loaded.model.config
    tokens, opts, chunk_sizes = _given_input(spec, cfg, found, schedules, opts, chunk_sizes)
    B, T = tuple(tokens.shape) if tokens is not None else (spec.batch, spec.seq_len_value())
    opts = replace(opts, chunks=spec.chunks_for(T))
    # once, before a random input is drawn: positions and memory of the whole run
    preflight(cfg, device, dtype, B, T, schedules, logics, spec, chunk_sizes, kept)
    if tokens is not None:  # a given input's length (a random input's was checked with the options)
        _check_plan(T, schedules, opts)
        check_boundaries(T, schedules, opts, draft_given=spec.draft != defaults.DRAFT)
    if tokens is None:
        tokens = random_tokens(cfg, T, B, spec.seed)
    if PROGRAM["own_process"]:
        # everything imported and built so far (torch alone is some 170k objects) lives until the
        # process exits, yet each full collection would scan it again (about 80 ms here, and a
        # compare triggers them); frozen, the collector looks only at what the run creates
        gc.freeze()
    return Setup(loaded, tokens.to(device), opts, schedules, logics, impl, audited, found, threads)


def _given_input(spec: RunSpec, cfg, found, schedules, opts: ScheduleOptions, chunk_sizes):
    """(tokens or None for a random input, options, chunk sizes) from --text, --text-file (a
    chat's turns become its chunks) or --tokens."""
    if spec.text is not None or spec.text_file is not None:
        tokens, chat = text_input(spec, cfg, found, packed=defaults.PACKED in schedules)
        if chat is not None and "chunked" in schedules and chunk_sizes is None and spec.chunks is None:
            chunk_sizes = tuple(chat.chunk_sizes)  # one chunk per turn, as a chat reuses its cache
            opts = replace(opts, chunk_sizes=chunk_sizes)
        return tokens, opts, chunk_sizes
    if spec.tokens is not None:
        with flag("--tokens"):
            return load_tokens(spec.tokens, cfg.vocab_size, max_len=cfg.rotary_len), opts, chunk_sizes
    return None, opts, chunk_sizes


def _build_models(spec: RunSpec, impl: str, logics, device, dtype, sequence_len: int, float64: bool = False):
    """The model to run (loaded, built at random or tiny) and, with --impl nanochat|both, the
    user's: (loaded, audited or None, logics, discovered checkpoint or None)."""
    found = None
    if spec.discovers():
        found = locate(spec)
        # --impl nanochat loads the checkpoint into the user's code only (attach)
        try:
            loaded = None if impl == "nanochat" else load_checkpoint(found.leaf, found.step, device=device, dtype=dtype)
        except NoSmearParameters as e:
            e.found = found  # the commands report which checkpoint has no smear
            raise
    elif spec.model_kind() == ModelKind.tiny:  # (--step without a checkpoint: check_arguments)
        loaded = tiny_model(device=device, dtype=dtype)
    else:
        try:
            if spec.preset is not None:
                config = preset_config(spec.preset.value, spec.depth)
            else:
                config = random_config(spec.depth_value(), sequence_len=sequence_len)
        except ConfigError as e:
            raise UserError(f"--depth {spec.depth_value()}: {e}") from e
        try:
            # its float64 copy made while drawing only where our model is compared (with --impl
            # nanochat the user's model runs in its place, and ours would hold a copy no one reads)
            loaded = random_model(config, seed=spec.seed, device=device, dtype=dtype,
                                  float64=float64 and impl in ("ours", "both"))
        except TooLarge as e:
            raise UserError(f"{e} (lower --depth)") from e
    audited = None
    if impl != "ours":
        try:
            loaded, audited, logics = attach(spec, loaded, device, dtype, found)  # errors name the checkout
        except NoSmearParameters as e:
            e.found = found
            raise
    return loaded, audited, logics, found


NO_SMEAR_VERDICT = "no smear parameters: issue #756 cannot affect this model"


def checkpoint_info(found) -> Optional[dict]:
    """The discovered checkpoint for a JSON document (None when no checkpoint was loaded)."""
    if found is None:
        return None
    return {"path": str(found.leaf), "source": found.source, "tag": found.tag, "step": found.step,
            "base_dir": None if found.base_dir is None else str(found.base_dir),
            "tokenizer": None if found.tokenizer is None else str(found.tokenizer),
            "description": found.description}


def locate(spec: RunSpec):
    """The checkpoint --checkpoint / --source / --model-tag / --step point at, announced on stderr."""
    from ..gpt.discover import discover

    source = getattr(spec.source, "value", spec.source)
    given = spec.checkpoint is not None  # its messages start with the path: "--checkpoint DIR: ..."
    with flag("--checkpoint" if given else "--source/--model-tag", " " if given else ": "):
        try:
            found = discover(spec.checkpoint, source, spec.model_tag, spec.step)
        except NoSuchStep as e:
            raise UserError(f"{e} (choose one with --step)") from e
        except UserError:
            path = None if spec.checkpoint is None else Path(os.path.expanduser(str(spec.checkpoint)))
            if path is not None and path.is_dir() and not any(p.is_dir() for p in path.iterdir()):
                find_step(path, spec.step)  # a leaf with a broken pair: its own, more precise message
            raise
    where = f" under {found.base_dir}" if found.tag else ""
    sys.stderr.write(f"smearcli: checkpoint {found.description}{where}\n")
    return found


def text_input(spec: RunSpec, cfg, found, packed: bool = False):
    """(1, T) ids of --text / --text-file, and the ChatIds with --chat (else None). A byte-level model
    takes the bytes; any other through the checkpoint's tokenizer.pkl (tokenizer.load_tokenizer).
    `packed` (--schedules packed): the text is split into documents at each <|bos|> marker, each
    one after the BOS id (`tokenizer.encode_documents`, `inputs.text_documents`)."""
    name = "--text-file" if spec.text_file is not None else "--text"
    if cfg.is_byte_level and not spec.chat:
        from ..measure.packed import default_bos

        bos = default_bos(cfg) if packed else None
        if spec.text_file is not None:
            with flag("--text-file"):
                return read_text_file(spec.text_file, cfg, bos), None
        with flag("--text", ": "):
            return (text_tokens(spec.text, cfg) if bos is None else text_documents(spec.text, cfg, bos)), None
    from ..gpt import tokenizer as tok

    text = spec.text
    with flag(name, ": "):
        if spec.text_file is not None:  # the same checks as a byte-level model's file: size, kind
            try:
                text = read_text_bytes(spec.text_file).decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{spec.text_file}: not UTF-8 text ({e})") from None
        if not text:
            raise UserError("the text is empty")
        what = "a chat (--chat)" if spec.chat else f"a model with a vocabulary of {cfg.vocab_size:,} (not bytes)"
        if found is None:
            raise UserError(f"{what} needs the nanochat tokenizer of a --checkpoint (tokenizer.pkl); "
                            "give token ids with --tokens instead")
        if found.tokenizer is None:
            looked = ", ".join(map(str, tok.tokenizer_candidates(found.leaf, found.base_dir)))
            raise UserError(f"{what} needs its nanochat tokenizer, and there is no tokenizer.pkl (looked for "
                            f"{looked}); give token ids with --tokens instead")
    try:
        enc = tok.load_tokenizer(found.tokenizer)
    except UserError as e:  # its messages name the file only: say where it is
        msg = str(e)
        where = f"{found.tokenizer.parent}/" if msg.startswith(found.tokenizer.name) else ""
        raise UserError(where + msg) from e
    with flag(name, ": "):
        tok.check_vocab(enc, cfg.vocab_size)
        if not spec.chat:
            encode = tok.encode_documents if packed else tok.encode_text
            return torch.tensor([encode(enc, text, vocab_size=cfg.vocab_size)]), None
        try:
            chat = tok.encode_chat(enc, json.loads(text), vocab_size=cfg.vocab_size)
        except (json.JSONDecodeError, RecursionError) as e:
            raise UserError('with --chat, the input is a JSON list of turns, e.g. ["Hi!", "Hello.", "Why?"] '
                            f"(invalid JSON: {e})") from None
        except ValueError as e:
            raise UserError(f"with --chat, {e}") from None
        return torch.tensor([chat.ids]), chat
