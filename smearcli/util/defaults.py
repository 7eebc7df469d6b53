"""The names and defaults every layer shares, importable without torch (so `--help` is fast).

`schedules.SCHEDULES` starts with exactly the built-in schedules named here, and `smear.LOGICS`
implements exactly these logics, in this order (asserted there); the CLI's option defaults, the
library's keyword defaults, the notebooks and the docs all read them from here. A schedule
registered later (`schedules.register`) needs no name here."""

SCHEDULE_NAMES = ("full", "prefill", "decode", "chunked", "engine", "speculative", "packed", "padded", "rollback",
                  "prefix")
REFERENCE = "full"  # the schedule every other run is measured against
# run only by an engine that does them itself (a prefix cache shared between requests): not in
# the default list of implementations that are driven step by step
ENGINE_SCHEDULES = ("prefix",)
# what compare runs by default: the chunk-boundary schedules (packed, padded and rollback are asked for)
DEFAULT_SCHEDULES = ("prefill", "decode", "chunked", "engine", "speculative")
LOGIC_NAMES = ("old", "fixed")  # what `--logic both` runs: upstream and the #756 fix
# Every logic `smear.LOGICS` implements: the two above and the variant that skips the smear where
# the current token is BOS (parameter-golf's `not_bos` mask), which the packed schedule adds.
BOS_MASKED = "bosmask"
ALL_LOGICS = LOGIC_NAMES + (BOS_MASKED,)
PACKED = "packed"  # the schedule that runs every logic of ALL_LOGICS by default

# Defaults of the schedules' own options (`schedules.ScheduleOptions`).
CHUNKS = 4  # chunked: near-equal chunks
SAMPLES = 2  # engine: rows the batch-1 prefill is expanded to
GEN_LEN = 32  # engine, speculative: tokens after the prompt
DRAFT = 4  # speculative: tokens per verify step
REJECT = 2  # rollback: draft tokens rejected at each verify step (of DRAFT)
FIRST_TOKENS = 8  # packed: a document's "first tokens", where a leak is measured beside its BOS
# the kinds of boundary the built-in boundaries (`smearcli.measure.boundaries`) record in RunResult.marks
# (here: the packed figure names one without importing torch; a new boundary names its own)
DOCUMENT_START = "document_start"  # a document's BOS, after position 0 of a packed row
PADDING = "padding"  # where a row's padding begins (right) or its real tokens begin (left)
ROLLBACK = "rollback"  # where a verify step's rejected tokens were cut from the cache

USER_CODE_TIMEOUT = 600.0  # seconds per call into a user's nanochat code (an import, one forward)

NOISE_MARGIN = 10.0  # an error this many times the measured noise floor is no longer rounding
# Schedules that feed several tokens to a non-empty cache: where the old logic drops a predecessor.
CHUNK_START_SCHEDULES = ("chunked", "speculative")


def layer_names(n_layer: int) -> list[str]:
    """Our GPT's capture points: the post-smear embedding, every block's output, the logits."""
    return ["emb"] + [f"block{i}" for i in range(n_layer)] + ["logits"]


def figure_schedule(names) -> str:
    """The one schedule a figure shows when none is named: chunked if among `names`, else the first
    of them that has chunk starts, else the first."""
    names = list(names)
    if not names:
        raise ValueError("no schedules to choose from")
    if "chunked" in names:
        return "chunked"
    return next((n for n in names if n in CHUNK_START_SCHEDULES), names[0])

# generate's own paths (engines.transformers.reach) and their reproducer (engines.transformers.repro)
GENERATE_NEW = 6  # tokens generated per path
GENERATE_CHUNK = 16  # prefill_chunk_size
GENERATE_PADS_INSIDE = 5  # the chunked padded batch's pads: fewer than the chunk, so its first chunk holds pads and tokens
GENERATE_BEAMS = 4  # beam search's beams: with 2 the kept beams often stay in their order, so the cache's
# reorder is the identity and tests nothing (mamba on 5.12.1, #46612: seed 0 agrees at 2 beams, departs by 5.7 at 4)
GENERATE_PATH = "generate: "  # a finding only generate's own paths show: its worst_schedule is this, then the path
