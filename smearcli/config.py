"""The model's configuration: the `model_config` dict of a nanochat checkpoint's meta JSON.

Pure Python (no torch) so the CLI can validate a config before paying for heavy imports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# Channel counts fixed by the architecture (not by the config): the one definition of each.
SMEAR_GATE_CHANNELS = 24  # the smear gate reads the first 24 channels of the current token
VE_GATE_CHANNELS = 12  # each value-embedding gate reads the first 12 channels of its block input
BYTE_VOCAB = 256  # a byte-level model: its token ids are byte values, its text needs no tokenizer


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
