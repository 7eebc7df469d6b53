"""`--schedules packed` from the CLI: the packed row's input (BOS at each document's start), the
per-document measurement of `smearcli.measure.packed`, and its report (table, smearcli.packed/1, --save,
the figure of the first logic's run)."""

from __future__ import annotations

from ..util.errors import UserError
from .reports import Job, Report


def bos_for(setup) -> int:
    """The BOS id: the checkpoint tokenizer's <|bos|> where there is one, else `packed.default_bos`."""
    from ..measure.packed import default_bos

    found = setup.found
    if found is not None and found.tokenizer is not None and not setup.model.config.is_byte_level:
        from ..gpt import tokenizer as tok

        try:
            return tok.special_id(tok.load_tokenizer(found.tokenizer), tok.BOS)
        except (UserError, KeyError, ValueError):
            pass
    return default_bos(setup.model.config)


def packed_input(spec, setup):
    """(tokens, lengths): with --documents, the lengths and BOS written at each start (random input:
    seeded ids with no other BOS); without, the input split at each BOS. A text is already split at
    its <|bos|> markers (`build.text_input`); with --documents too, the two must agree."""
    from ..measure.boundaries import document_starts, split_on_bos
    from ..measure.packed import packed_tokens
    from ..gpt.tokenizer import BOS

    bos, tokens = bos_for(setup), setup.tokens
    lengths = spec.document_lengths()
    given = any(v is not None for v in (spec.tokens, spec.text, spec.text_file))
    if lengths is not None:
        if sum(lengths) != tokens.size(1):
            raise UserError(f"--documents: the lengths sum to {sum(lengths)} but the input has {tokens.size(1)} tokens")
        marked = split_on_bos(tokens[0], bos) if spec.text is not None or spec.text_file is not None else []
        if len(marked) > 1 and marked != list(lengths):
            raise UserError(f"--documents {','.join(map(str, lengths))}: the text's {BOS} markers split it into "
                            f"documents of {','.join(map(str, marked))} tokens; give the markers or --documents")
        if not given:
            return packed_tokens(setup.model.config.vocab_size, lengths, bos, spec.seed,
                                 tokens.size(0)).to(tokens.device), list(lengths)
        tokens = tokens.clone()
        tokens[:, document_starts(lengths)] = bos
        return tokens, list(lengths)
    if not given:
        raise UserError("--schedules packed needs --documents LENGTHS (e.g. 100,60,96), or an input whose "
                        f"documents each begin with BOS (id {bos})")
    splits = []
    for row in tokens:
        try:
            splits.append(split_on_bos(row, bos))
        except ValueError as e:
            raise UserError(f"--schedules packed: {e}; give --documents LENGTHS") from None
    if any(s != splits[0] for s in splits):
        raise UserError("--schedules packed: the rows split into different documents at BOS; give one row")
    if len(splits[0]) < 2:  # nothing to leak across: a check of it would pass having checked nothing
        raise UserError(f"--schedules packed: the input is one document of {splits[0][0]} tokens (no BOS, id "
                        f"{bos}, after position 0), so no boundary between documents is ever crossed; mark "
                        "each document's start, or give --documents LENGTHS")
    return tokens, splits[0]


# the packed table's columns a narrow console leaves out first: the analytic check, then what the
# JSON and a wider terminal keep
PACKED_DROP = ("residual", "gate*x_prev", "emb@BOS", "len", "xnoise")


class PackedReport(Report):
    def __init__(self, result, info, footer):
        self.result, self.info, self.footer = result, info, footer
        self.verdict, self.failed = result.verdict, result.failed

    def document(self) -> dict:
        from ..measure.packed import to_json

        return to_json(self.result, self.info)

    def render(self, console) -> None:
        """Title, the table fitted to the console (the analytic check's columns, then the lengths
        and noise multiples, are left out first, and said so), legend, verdict."""
        from ..measure import packed
        from ..render.table import fitted_table, left_out_note, print_table, say, title_line

        p = self.result
        say(console, title_line(p.logics[0].comparison), highlight=False)
        say(console, packed.title(p), highlight=False)
        head, rows = packed.table_data(p)
        columns = [(name, "left" if i == 0 else "right") for i, name in enumerate(head)]
        table, left_out = fitted_table(columns, rows, console.width, drop=PACKED_DROP)
        print_table(console, table)
        for line in [*packed.legend(p), left_out_note(left_out, console.width), self.footer]:
            if line:
                say(console, line, highlight=False, markup=False)
        say(console, f"[{'bold red' if self.failed else 'bold'}]{p.verdict}[/]")

    def payload(self) -> dict:
        from ..measure.jsondoc import save_payload

        return save_payload(self.document(), {f"{lg.label}_": lg.comparison for lg in self.result.logics})

    def figure(self, schedule: str):
        return self.result.logics[0].comparison, None, ""

    def draw(self, schedule: str, kind: str):
        """all and error: the packed figure of every logic (`render.packed_figure`); heatmap and
        kl: the standard panels of the first logic's comparison."""
        if kind in ("all", "error"):
            from ..render import packed_figure

            return packed_figure.figure(self.result, kind)
        return super().draw(schedule, kind)


def packed_job(spec, setup, tolerance, info) -> Job:
    from ..util.defaults import FIRST_TOKENS
    from ..gpt.gpt_runners import runners

    tokens, lengths = packed_input(spec, setup)
    bos = int(tokens[0, 0])
    theirs = None
    if setup.audited is None:
        group = runners(setup.model, setup.logics, setup.loaded.name, bos=bos)
    else:  # the user's checkout; with --impl both, ours (old, fixed) beside it on the same weights
        from ..engines.nanochat.adapter import NanochatRunner

        theirs = NanochatRunner(setup.audited, setup.loaded.name)
        ours = runners(setup.model, setup.logics, setup.loaded.name, bos=bos) if setup.impl == "both" else []
        group = ours + [theirs]

    def run(bar):
        from ..measure import packed

        result = packed.measure(group, tokens, lengths, FIRST_TOKENS, spec.leak_limit, tolerance,
                                progress=bar.label, tokens_progress=bar.tokens)
        if theirs is not None and result.get(theirs.label).unsplit is None:
            result.notes.append(f"{theirs.label}: {theirs.document_note}")
        return PackedReport(result, info, setup.threads)
    return Job(run, setup.loaded.name)
