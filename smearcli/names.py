"""Names of schedules and smear logics, importable without torch (for fast --help).

`schedules.SCHEDULES` and `smear.LOGICS` implement exactly these, in this order (asserted there)."""

SCHEDULE_NAMES = ("full", "prefill", "decode", "chunked", "engine", "speculative")
REFERENCE = "full"  # the schedule every other run is measured against
LOGIC_NAMES = ("old", "fixed")
