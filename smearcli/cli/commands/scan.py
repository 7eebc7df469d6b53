"""`smearcli scan`: every causal-LM architecture an engine runs (`--engine`: the engines registered
in `smearcli.census.engines`), checked the way `compare --impl hf` checks one (the work is
`smearcli.census`)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ...util import jsonsafe
from ...census import engines
from ...engines import registry  # noqa: F401 - importing it registers every built-in engine
from ...util.errors import UserError
from ..errors import CheckFailed, guarded
from ..record_file import resumable, written
from ..options import check_scope, foreign_python


SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
MAX_TIMEOUT = 1e6  # seconds, as --user-code-timeout: beyond it a limit means nothing
MIN_MEMORY_MB, MAX_MEMORY_MB = 64, 1 << 27  # 128 TiB: all the address space x86-64 gives a process
# the options that only mean something when architectures run (with --merge nothing runs)
RUN_ONLY = {"out": "--out", "jobs": "--jobs", "shard": "--shard", "claims": "--claims", "resume": "--resume",
            "only": "--only",
            "timeout": "--timeout", "memory_mb": "--memory-mb", "repro_dir": "--repro-dir", "engine": "--engine",
            "engine_python": "--engine-python"}
ENGINES = tuple(engines.names())  # the built-in engines, for --engine's help (a later registration runs too)


def parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    m = SHARD.fullmatch(text)
    if m is None:
        raise UserError(f"--shard takes i/n (like 2/4), got {text!r}")
    i, n = int(m[1]), int(m[2])
    if n < 1 or not 1 <= i <= n:
        raise UserError(f"--shard {text}: i must be between 1 and n")
    return i, n


def parse_only(text: Optional[str]) -> Optional[list[str]]:
    """--only's model types in order; None without --only. An empty list would check nothing and
    a name twice would check it twice (two records for one architecture): both refused."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UserError(f"--only {text!r} names no model type; give some, like --only llama,bamba")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"--only names {', '.join(twice)} more than once")
    return names


def check_limits(jobs: int, timeout: float, memory_mb: int) -> None:
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")
    if not 0 < timeout <= MAX_TIMEOUT:  # also refuses nan and inf
        raise UserError(f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT:g}], got {timeout}")
    if not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB:
        raise UserError(f"--memory-mb must be between {MIN_MEMORY_MB} and {MAX_MEMORY_MB} (128 TiB), got {memory_mb}")


def refuse_run_options(ctx: typer.Context) -> None:
    """With --merge nothing runs: an option that only steers a run is a mistake, not a no-op.
    (Sources compared by name: typer may bring its own copy of click's ParameterSource.)"""
    given = [flag for name, flag in RUN_ONLY.items()
             if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]
    if given:
        raise UserError(f"--merge checks nothing, it reports the files given: {', '.join(given)} "
                        f"{'has' if len(given) == 1 else 'have'} no meaning with it")


def check_output(flag: str, path: Path, suffixes=None) -> None:
    """An output path refused before the first architecture runs: a directory, a device, a FIFO,
    a missing or read-only directory (the message starts with the option)."""
    from ...util.files import check_output_path

    try:
        check_output_path(path, suffixes)
    except UserError as e:
        raise UserError(f"{flag} {e}") from None


def check_repro_dir(path: Path) -> None:
    """--repro-dir: an existing directory we can write in, or one we can make in an existing one."""
    if path.exists() and not path.is_dir():
        raise UserError(f"--repro-dir {path}: not a directory")
    if not path.is_dir():  # made when the first finding is written: its parent must take it
        check_output("--repro-dir", path)
        return
    try:  # a real write (root passes os.access even on a read-only file system)
        fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=".tmp", dir=path)
    except OSError as e:
        raise UserError(f"--repro-dir {path}: cannot write in it ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def check_repro_files(repro_dir: Path, names, tails) -> None:
    """The reproducer and draft paths of these architectures (`tails` after each name: the engine's
    `Engine.tails()`): none may be a directory, a device or a FIFO (writing one would block, or
    write to the device)."""
    from ...util.files import special_kind

    for name in names:
        for tail in tails:
            p = repro_dir / f"{name}{tail}"
            try:
                mode = os.stat(p).st_mode
            except OSError:
                continue
            if not stat.S_ISREG(mode):
                kind = "directory" if stat.S_ISDIR(mode) else special_kind(mode)
                raise UserError(f"--repro-dir {p}: a {kind} where {name}'s reproducer would go; move it away")


def distinct(inputs: list, outputs: list) -> None:
    """No output is one of the files read or another output: --markdown over --out (or over a
    --merge input) would replace the records it is made from. Each list holds (option, path)."""
    seen = {os.path.realpath(p): f"{flag} {p}" for flag, p in inputs}
    for flag, p in outputs:
        if p is None:
            continue
        key = os.path.realpath(p)
        if key in seen:
            raise UserError(f"{flag} {p} is also {seen[key]}; give each its own file")
        seen[key] = f"{flag} {p}"


def meta() -> dict:
    """The versions of smearcli's own process, in every run's meta (an engine's session adds its own)."""
    import platform

    import torch
    import transformers

    return {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "python": platform.python_version()}


def engine_of(name: str) -> "engines.Engine":
    if name not in engines.names():
        raise UserError(f"--engine takes {' or '.join(engines.names())}, got {name!r}")
    return engines.get(name)


def python_of(engine: "engines.Engine", given: Optional[Path]) -> tuple[Optional[str], str]:
    """(the engine's Python, the option or variable it came from); (None, "") for an in-process engine."""
    flag_name = "--engine-python"
    if engine.env_var is None:
        if given is not None:
            raise UserError(f"--engine {engine.name} runs in smearcli's own Python: {flag_name} has no meaning with it")
        return None, ""
    return foreign_python(given, flag_name, engine.env_var, f"--engine {engine.name}", engine.environment)


@guarded
def scan(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="The JSON Lines file each architecture's record "
                   "is appended to as it finishes.")] = Path("scan.jsonl"),
    jobs: Annotated[int, typer.Option("--jobs", help="Architectures checked at once, one process each.")] = 1,
    shard: Annotated[Optional[str], typer.Option("--shard", help="i/n: check only the i-th of n shares "
                     "of the list (a CI matrix); merge the files with --merge.")] = None,
    claims: Annotated[Optional[Path], typer.Option("--claims", metavar="DIR", help="Share the architectures "
                      "with the other scans run at once with this DIR (each its own --out): each takes the next "
                      "one none has taken, so they end together; merge the files with --merge. Use a fresh DIR "
                      "per census.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip the architectures --out already holds.")] = False,
    only: Annotated[Optional[str], typer.Option("--only", help="Comma-separated model types to check "
                    "(default: every causal LM in the auto mapping).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds one architecture may take.")] = 240.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Address space one architecture's process "
                         "may use, in MiB.")] = 3072,
    repro_dir: Annotated[Path, typer.Option("--repro-dir", help="Where each finding's standalone "
                         "reproducer is written (and run).")] = Path("scan-repro"),
    merge: Annotated[Optional[list[Path]], typer.Option("--merge", help="Check nothing: report the "
                     "records of these scan files (shards) as one.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the smearcli.scan/1 document "
                        "instead of the table.")] = False,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Also write the census as "
                        "Markdown to this file.")] = None,
    figure: Annotated[Optional[Path], typer.Option("--figure", help="Also draw architectures x "
                      "schedules (error over the floor) to this .png, .svg or .pdf.")] = None,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if an architecture fails by its engine's words ("
                     + "; ".join(f"{e.name}: {', '.join(e.failing)}" for e in engines.ENGINES.values())
                     + ") with a finding upstream does not know (new) or had fixed (a regression); known open "
                     "bugs are listed, not failed. `--check all`: exit 1 on every such architecture.")] = False,
    engine: Annotated[str, typer.Option("--engine", help="Where the cached paths run: " + "; ".join(
                      f"{e.name} ({e.help})" for e in engines.ENGINES.values()) + ".")] = "transformers",
    engine_python: Annotated[Optional[Path], typer.Option("--engine-python", help="The Python of the engine's own "
                             "environment, for an engine that runs in one (" + "; ".join(
                                 f"{e.name}: default ${e.env_var}" for e in engines.ENGINES.values() if e.env_var)
                             + ").")] = None,
    against: Annotated[Optional[list[Path]], typer.Option("--against", help="A previous census's record file "
                       "(another release of the same engine; repeat for its shards): print what changed per "
                       "architecture; with --check exit 1 on regressions only.")] = None,
    against_source: Annotated[Optional[Path], typer.Option("--against-source", help="With --against: the "
                              "previous release's transformers package directory, to quote the lines of each "
                              "changed architecture's modeling file that changed.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per architecture on stderr.")] = False,
    release: Annotated[Optional[str], typer.Option("--release", help="Run this scan on another transformers "
                       "release (like 5.23.0): its wheel fetched with pip into $SMEARCLI_RELEASES (default "
                       "~/.cache/smearcli/releases) and installed in a venv of its own over this Python.")] = None,
    bisect: Annotated[Optional[str], typer.Option("--bisect", metavar="ARCH", help="Find the first transformers "
                      "release where ARCH has a finding and the first after it where it is gone, probing "
                      "releases as git bisect probes commits (each a scan --only ARCH on that release).")] = None,
    bisect_path: Annotated[Optional[str], typer.Option("--bisect-path", metavar="GLOB", help="With --bisect: follow "
                           "only a finding on a path matching GLOB (a schedule, a boundary or 'generate: PATH', "
                           "e.g. 'rollback*'); a release whose findings lie elsewhere counts as without it.")] = None,
    releases_span: Annotated[Optional[str], typer.Option("--releases", metavar="A..B", help="With --bisect: the "
                             "releases searched, both ends included (like 5.20.0..5.25.0; default: every 5.x).")] = None,
    wheels: Annotated[Optional[Path], typer.Option("--wheels", metavar="DIR", help="With --release or --bisect: "
                      "take transformers wheels from DIR (pip download --no-deps transformers==X -d DIR), "
                      "nothing from the network.")] = None,
    scope: Annotated[Optional[str], typer.Argument(hidden=True, metavar="[all]", help="After --check: `all` fails "
                     "on known findings too.")] = None,
) -> None:
    """Check every causal-LM architecture of the installed transformers: a tiny config derived
    from each config class's defaults, the full pass against fuzzed cached schedules and the padded
    and rollback boundaries over a float64 noise floor, the carried state shown to matter before an ok, the error's shape named, and a
    standalone reproducer per finding. Each architecture runs in its own process with --timeout
    and --memory-mb; records stream to --out. Try: smearcli scan --only bamba,llama."""
    if any(x is not None for x in (release, bisect, releases_span, wheels, bisect_path)):
        return on_releases(ctx, release, bisect, releases_span, wheels, bisect_path)
    from ...census import known, records as census_records, report

    every = check_scope("scan", check, scope)
    eng = engine_of(engine)
    if not eng.concurrent and jobs != 1:
        raise UserError(f"--engine {eng.name} checks one architecture at a time; drop --jobs, or split the census "
                        "with --shard")
    check_limits(jobs, timeout, memory_mb)
    part = parse_shard(shard)
    if part is not None and claims is not None:
        raise UserError("--shard and --claims both split the census: give one")
    if claims is not None and claims.exists() and not claims.is_dir():
        raise UserError(f"--claims {claims}: not a directory (the claims are one empty file per architecture in it)")
    wanted = parse_only(only)
    if merge:
        refuse_run_options(ctx)
    else:
        check_output("--out", out)
        check_repro_dir(repro_dir)
    if markdown is not None:
        check_output("--markdown", markdown)
    if figure is not None:
        check_output("--figure", figure, (".png", ".svg", ".pdf"))
    distinct([("--merge", p) for p in merge or []] + [("--against", p) for p in against or []],
             [("--out", None if merge else out), ("--markdown", markdown), ("--figure", figure)])
    previous = read_against(against, merge, against_source)  # refused before anything runs
    if previous is not None and not merge:
        was = engines.of_records(previous).name
        if was != engine:
            raise UserError(f"--against holds a census on {was}, and this one runs on {engine} "
                            "(--engine): a diff is between releases of one engine")
    table = known.load()  # what upstream knows: a broken table is refused before anything runs
    t0 = time.monotonic()
    info = meta()
    if merge:
        records = known.place(census_records.merge(merge), table)
        eng = engines.of_records(records)
        if previous is not None and engines.of_records(previous).name != eng.name:  # before any output
            raise UserError(f"--against holds a census on {engines.of_records(previous).name}, and --merge's on "
                            f"{eng.name}: a diff is between releases of one engine")
    else:
        if resume:  # another engine's or release's records are refused before the engine starts
            resumable(out, eng.name, info["transformers_version"])
        records, mine = _run(eng, python_of(eng, engine_python), out, jobs, part, claims, resume, wanted,
                             timeout, memory_mb, repro_dir, quiet)
        records = known.place(records, table)  # every finding against what upstream knows
        info |= mine | {"wall_s": round(time.monotonic() - t0, 1)}
        eng.finish(records, info)  # transformers: one draft per root cause, a known bug's a comment for its thread
    if merge:
        info["wall_s"] = round(time.monotonic() - t0, 1)
    if json_out:
        sys.stdout.write(jsonsafe.dumps(report.document(records, info), indent=1, default=str) + "\n")
    else:
        sys.stdout.write(report.table(records) + "\n")
    if markdown is not None:
        from ...util.files import atomic_write

        with atomic_write(markdown) as f:
            f.write(report.markdown(records, info, eng))
    if figure is not None and any(r.schedules for r in records):
        from ...render import figures, scan_figure

        figures.save(scan_figure.figure(records), figure)
    if previous is not None:  # --against: what changed, and --check gates on regressions alone
        from ...census import diff

        changes = diff.compare(previous, records, sources(against_source))
        (sys.stderr if json_out else sys.stdout).write(
            "\n".join(diff.lines(changes, diff.release(previous), diff.release(records))) + "\n")
        gone = known.stale(records, table)
        if gone:  # entries that matched nothing here although their architectures ran
            (sys.stderr if json_out else sys.stdout).write(
                "known upstream, matched by no finding here (fixed upstream, or a rule of ours changed: mend "
                "smearcli/census/known.toml): " + ", ".join(f"{e.id} ({', '.join(e.architectures)})" for e in gone)
                + "\n")
        worse = diff.regressions(changes)
        if check and worse:
            raise CheckFailed(f"{len(worse)} architecture{'s' * (len(worse) != 1)} regressed against "
                              f"{diff.release(previous)}: {', '.join(c.model_type for c in worse)}")
        return
    failing = [r for r in records if r.verdict in eng.failing]
    if not check or not failing:
        return
    if every:
        raise CheckFailed(f"{len(failing)} architectures disagree with their full pass: "
                          f"{', '.join(r.model_type for r in failing)}")
    fresh = known.failing(records, eng.failing)
    listed = [f"{r.model_type} ({known.worst(r)})" for r in failing if r not in fresh]
    if listed:
        sys.stderr.write(f"known upstream, listed and not failed: {', '.join(listed)}\n")
    if fresh:
        raise CheckFailed(f"{len(fresh)} architecture{'s' * (len(fresh) != 1)} with a finding upstream does not know "
                          f"or had fixed: {', '.join(f'{r.model_type} ({known.worst(r)})' for r in fresh)}")


RELEASE_OPTIONS = {"release", "bisect", "releases_span", "wheels", "bisect_path"}  # what --release and --bisect take themselves
BISECT_PASSES = {"timeout", "memory_mb", "quiet"}  # what a --bisect probe's scan is given as well
OFFLINE = ("offline? fetch the wheels where there is a network (pip download --no-deps transformers==X -d DIR) "
           "and pass --wheels DIR")


def given(ctx: typer.Context) -> list:
    """This command's parameters given on the command line (not left at their defaults)."""
    return [p for p in ctx.command.params
            if getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]


def given_args(ctx: typer.Context, skip) -> list[str]:
    """The command line of this scan as given, less the parameters named in `skip`: the same scan,
    to run in another Python."""
    out, positional = ["scan"], []
    for p in given(ctx):
        value = ctx.params.get(p.name)
        if p.name in skip:
            continue
        if p.param_type_name == "argument":  # not isinstance(click.Argument): typer 0.29 carries its own click
            positional += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]
            continue
        flag = max(p.opts, key=len)
        if p.is_flag:
            out += [flag] if value else [max(p.secondary_opts, key=len)] if p.secondary_opts else []
        elif p.multiple:
            out += [x for v in value or [] for x in (flag, str(v))]
        elif value is not None:
            out += [flag, str(value)]
    return out + positional


def on_releases(ctx: typer.Context, release: Optional[str], arch: Optional[str], span: Optional[str],
                wheels: Optional[Path], path: Optional[str] = None) -> None:
    """--release: this scan again, in that release's Python; --bisect: the search for the releases
    where ARCH's finding appears and is gone (the work is `engines.transformers.releases`)."""
    from ...engines.transformers import releases

    def say(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    if release is not None and arch is not None:
        raise UserError("--release runs one release and --bisect searches many: give one of them")
    if span is not None and arch is None:
        raise UserError("--releases is the range --bisect searches: it needs --bisect")
    if path is not None and arch is None:
        raise UserError("--bisect-path is the path a --bisect follows: it needs --bisect")
    if release is None and arch is None:
        raise UserError("--wheels is where --release or --bisect takes transformers from: it needs one of them")
    if wheels is not None and not wheels.is_dir():
        raise UserError(f"--wheels {wheels}: not a directory")
    try:
        if release is not None:
            env = releases.environment(releases.release(release), wheels, say=say)
            made = f" (made in {env.made_s:.0f} s)" if env.made_s is not None else ""
            where = "smearcli's own Python" if env.own else env.python
            say(f"transformers {env.version}: {where}{made}")
            status = releases.rerun(env, given_args(ctx, RELEASE_OPTIONS))
            if status:
                raise typer.Exit(status)
            return
        names = [n.strip() for n in arch.split(",") if n.strip()]  # --bisect's own words, not --only's
        if not names:
            raise UserError(f"--bisect {arch!r} names no model type; give one, like --bisect llama")
        if len(names) != 1:
            raise UserError(f"--bisect takes one model type, got {arch!r}")
        stray = [max(p.opts, key=len) for p in given(ctx) if p.name not in RELEASE_OPTIONS | BISECT_PASSES]
        if stray:
            raise UserError(f"--bisect runs its own scans (--only {arch}, records under ${releases.ENV_VAR}): "
                            f"{', '.join(stray)} {'has' if len(stray) == 1 else 'have'} no meaning with it")
        versions = releases.pick(releases.listed(wheels), span)
        passed = given_args(ctx, RELEASE_OPTIONS)[1:]
        say(f"bisect {arch}: {len(versions)} releases, {versions[0]} to {versions[-1]}"
            + (f"; a finding only on a path matching {path!r}" if path is not None else ""))

        def args(out: Path, repro: Path) -> list:
            return ["scan", "--only", arch, "--out", str(out), "--repro-dir", str(repro), "--quiet", *passed]

        def probe(version: str):
            return releases.probe(releases.environment(version, wheels, say=say), arch, args,
                                  engines.get("transformers").failing, path=path)

        found = releases.bisect(versions, probe, arch, say)
        sys.stdout.write("\n".join(releases.lines(found)) + "\n")
    except releases.Unreachable as e:
        raise UserError(f"{e}; {OFFLINE}") from None


def read_against(against, merge, source):
    """--against's records (its files merged as shards: a torn or foreign file, a file given twice,
    a file also given to --merge are refused, naming it), read before the census runs; None
    without --against."""
    from ...census import records as census_records

    if source is not None and not against:
        raise UserError("--against-source is the previous release's transformers directory: it needs --against")
    if source is not None and not (source / "models").is_dir():
        raise UserError(f"--against-source {source}: not a transformers package directory (no models/ in it)")
    if not against:
        return None
    mine = {os.path.realpath(p): p for p in merge or []}
    for p in against:
        if os.path.realpath(p) in mine:
            raise UserError(f"--against {p} is also --merge {mine[os.path.realpath(p)]}: a census compared with "
                            "itself shows nothing")
    return census_records.merge(against)


def sources(previous_dir):
    """Both releases' transformers directories (`engines.transformers.sources.Sources`, the installed
    one the later), None without --against-source."""
    if previous_dir is None:
        return None
    from ...engines.transformers.sources import Sources

    return Sources.installed(Path(previous_dir))


def _run(eng, python, out, jobs, part, claims, resume, wanted, timeout, memory_mb, repro_dir,
         quiet) -> tuple[list, dict]:
    """One census on `eng` (its Python and the option it came from in `python`): (every record
    --out holds, the engine's meta)."""
    from ...census import isolate
    from ..build import flag

    python, given_as = python
    with flag(given_as) if given_as else contextlib.nullcontext():  # a bad environment is exit 2, before any model
        session = eng.session(python, quiet)
    try:
        names = session.model_types()
        if wanted is not None:
            unknown = [n for n in wanted if n not in names]
            if unknown:
                raise UserError(f"--only: {', '.join(unknown)} is not {eng.names_are} ({len(names)} are)")
            names = list(wanted)
        if part is not None:
            share = isolate.shard(names, *part)
            if not share:
                raise UserError(f"--shard {part[0]}/{part[1]}: {len(names)} architectures make fewer than "
                                f"{part[0]} shares, so this one would check none")
            names = share
        check_repro_files(repro_dir, names, eng.tails())

        def run(sink, said):
            isolate.census(session, names, sink, jobs=jobs, timeout=timeout, memory=memory_mb << 20,
                           repro_dir=repro_dir, on_record=said,
                           claim=None if claims is None else isolate.claims(claims))
        recs = written(out, resume, quiet, run)
        return recs, session.meta()
    finally:
        session.close()
