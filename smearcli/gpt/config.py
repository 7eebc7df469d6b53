"""The model's configuration: the `model_config` dict of a nanochat checkpoint's meta JSON.

Pure Python (no torch) so the CLI can validate a config before paying for heavy imports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# Channel counts fixed by the architecture (not by the config): the one definition of each.
SMEAR_GATE_CHANNELS = 24  # the smear gate reads the first 24 channels of the current token
VE_GATE_CHANNELS = 12  # each value-embedding gate reads the first 12 channels of its block input
BYTE_VOCAB = 256  # a byte-level model: its token ids are byte values, its text needs no tokenizer
# torch counts a tensor's bytes in a signed 64-bit integer: at 8 bytes a value (float64), a tensor
# holds fewer than 2^60 values; a larger size overflows inside torch, before a preflight can refuse it
MAX_TENSOR_VALUES = 1 << 60


class ConfigError(ValueError):
    """A model_config that cannot describe a nanochat model."""


@dataclass(frozen=True)
class GPTConfig:
    sequence_len: int = 512  # training context: sets window sizes and the rotary table (10x)
    vocab_size: int = 256  # real vocabulary; tables are padded up to a multiple of 64
    n_layer: int = 4
    n_head: int = 2  # query heads
    n_kv_head: int = 2  # key/value heads (GQA when fewer than n_head)
    n_embd: int = 128
    window_pattern: str = "SSSL"  # L/S tiled over layers; the last layer is always L

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "window_pattern":
                if not isinstance(v, str):
                    raise ConfigError(f"window_pattern must be a string of L/S, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{f.name} must be an integer, got {v!r}")
            if v <= 0:
                raise ConfigError(f"{f.name} must be positive, got {v}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(f"n_embd ({self.n_embd}) is not divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head != 0:
            raise ConfigError(f"n_head ({self.n_head}) is not divisible by n_kv_head ({self.n_kv_head})")
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.n_embd < SMEAR_GATE_CHANNELS:
            raise ConfigError(f"n_embd ({self.n_embd}) must be >= {SMEAR_GATE_CHANNELS}: the smear gate "
                              f"reads {SMEAR_GATE_CHANNELS} channels")
        if not self.window_pattern or any(c not in "SL" for c in self.window_pattern.upper()):
            raise ConfigError(f"window_pattern {self.window_pattern!r} may only contain 'S' and 'L'")
        self._check_addressable()

    def _check_addressable(self) -> None:
        """Refuse, by the field that sets it, a size whose largest tensor torch cannot address."""
        C = self.n_embd
        largest = (("n_embd", 4 * C * C, f"the MLP's {4 * C:,} x {C:,} matrix"),
                   ("vocab_size", self.padded_vocab_size * C, f"the {self.padded_vocab_size:,} x {C:,} embedding"),
                   ("sequence_len", self.rotary_len * (self.head_dim // 2),
                    f"the rotary table of {self.rotary_len:,} x {self.head_dim // 2:,}"),
                   ("n_layer", self.n_layer, "the per-layer scalars"))
        for name, values, what in largest:
            if values >= MAX_TENSOR_VALUES:
                raise ConfigError(f"{name} {getattr(self, name):,} is too large: {what} is beyond what "
                                  "a tensor can hold (2^60 values)")

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        """Build from a checkpoint's model_config; old checkpoints lack window_pattern ("L")."""
        if not isinstance(d, dict):
            raise ConfigError(f"model_config must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"model_config has unknown keys: {', '.join(unknown)}")
        required = known - {"window_pattern"}
        missing = sorted(required - set(d))
        if missing:
            raise ConfigError(f"model_config lacks {', '.join(missing)}")
        d = dict(d)
        d.setdefault("window_pattern", "L")
        return cls(**d)

    @property
    def shape(self) -> str:
        """"d4 n_embd 256": how a title line names the model's size."""
        return f"d{self.n_layer} n_embd {self.n_embd}"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def is_byte_level(self) -> bool:
        return self.vocab_size == BYTE_VOCAB

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        return ((self.vocab_size + 63) // 64) * 64

    @property
    def rotary_len(self) -> int:
        """Positions the rotary table covers (upstream over-allocates 10x the context)."""
        return self.sequence_len * 10

    @property
    def window_sizes(self) -> list[int]:
        """Left window per layer: a query at i sees keys i-w..i (w+1 keys)."""
        long_w = self.sequence_len
        short_w = -(-self.sequence_len // 512) * 128  # ceil(sequence_len / 4 / 128) * 128
        pat = self.window_pattern.upper()
        ws = [long_w if pat[i % len(pat)] == "L" else short_w for i in range(self.n_layer)]
        ws[-1] = long_w
        return ws

    def has_ve(self, layer: int) -> bool:
        """Value-embedding layers alternate, and the last layer always has one."""
        return layer % 2 == (self.n_layer - 1) % 2

    @property
    def backout_layer(self) -> int:
        return self.n_layer // 2


# -- nanochat's model sizes ----------------------------------------------------------------------
# How upstream's scripts/base_train.py (commit 92d63d4) sizes a model from its one dial, --depth:
# width = depth x aspect ratio 64, rounded up to a multiple of the 128-dim head; heads = width /
# 128; as many key/value heads as query heads; context 2048; windows "SSSL". The one sizing rule
# here: the presets, --depth alone (the small preset's byte vocabulary and context 512) and
# weights.random_config all call nanochat_shape.
NANOCHAT_ASPECT_RATIO = 64
NANOCHAT_HEAD_DIM = 128
NANOCHAT_CONTEXT = 2048
# The tokenizer of nanochat's released models (the d20 speedrun, d32): 2^16 ids, special tokens
# included. Upstream's tok_train has defaulted to 32,768 since January 2026 (commit ccf4b7f).
NANOCHAT_VOCAB = 65536


def nanochat_shape(depth: int, vocab_size: int = NANOCHAT_VOCAB, sequence_len: int = NANOCHAT_CONTEXT,
                   window_pattern: str = "SSSL") -> GPTConfig:
    """The config nanochat's training script builds for `depth` layers."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ConfigError(f"depth must be a positive integer, got {depth!r}")
    width = -(-depth * NANOCHAT_ASPECT_RATIO // NANOCHAT_HEAD_DIM) * NANOCHAT_HEAD_DIM
    heads = width // NANOCHAT_HEAD_DIM
    return GPTConfig(sequence_len=sequence_len, vocab_size=vocab_size, n_layer=depth, n_head=heads,
                     n_kv_head=heads, n_embd=width, window_pattern=window_pattern)


@dataclass(frozen=True)
class Preset:
    """A named model shape and the input length a run takes by default."""
    name: str
    depth: int
    vocab_size: int
    sequence_len: int  # the model's training context (windows, rotary table)
    seq_len: int  # tokens per row of random input, unless given
    summary: str

    def describe(self) -> str:
        c = self.config()
        return (f"{self.name}: {self.summary}; d{c.n_layer}, {c.n_embd} wide, {c.n_head} heads of "
                f"{c.head_dim}, vocab {c.vocab_size:,}, {self.seq_len:,} tokens")

    def config(self, depth: "int | None" = None) -> GPTConfig:
        return nanochat_shape(self.depth if depth is None else depth, self.vocab_size, self.sequence_len)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("small", 4, BYTE_VOCAB, 512, 256, "the small default, byte vocabulary, context 512: seconds on a CPU"),
    Preset("d12", 12, NANOCHAT_VOCAB, NANOCHAT_CONTEXT, NANOCHAT_CONTEXT, "nanochat d12 (its reference size)"),
    Preset("d20", 20, NANOCHAT_VOCAB, NANOCHAT_CONTEXT, NANOCHAT_CONTEXT, "nanochat d20 (the speedrun model)"),
    Preset("d26", 26, NANOCHAT_VOCAB, NANOCHAT_CONTEXT, NANOCHAT_CONTEXT, "nanochat d26 (about GPT-2)"),
    Preset("d32", 32, NANOCHAT_VOCAB, NANOCHAT_CONTEXT, NANOCHAT_CONTEXT, "nanochat d32"),
]}


def preset_config(name: str, depth: "int | None" = None) -> GPTConfig:
    """The model config of preset `name` (at `depth` layers instead of its own, if given)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name].config(depth)
