"""The option checks of `--impl`: which implementation runs, and whether the options given fit it
(the facts are the registry's, `engines.registry`; the flags are the CLI's, `options.said`)."""

from __future__ import annotations

from ..engines.registry import REGISTRY, Implementation
from ..util.errors import UserError
from .options import RunSpec, flag_of, said


def given(spec, field: str) -> bool:
    return getattr(spec, field) != getattr(RunSpec(), field)


def implementation(spec, command: str) -> Implementation:
    """The implementation `--impl` names, with every option-level check: unknown names, options
    it needs or refuses, options another implementation owns, and commands it does not serve."""
    spec.check_impl()  # values every implementation checks alike (a timeout in seconds)
    impl = REGISTRY.get(spec.impl)
    if impl is None:
        raise UserError(f"--impl: unknown implementation {spec.impl!r}; choose from {', '.join(REGISTRY)}")
    if command not in impl.commands:
        served = [n for n, i in REGISTRY.items() if command in i.commands]
        raise UserError(f"--impl {impl.name}: {command} does not run this implementation "
                        f"(it runs {', '.join(served)})")
    for field, what in impl.needs:
        if not given(spec, field):
            raise UserError(f"--impl {impl.name} needs {flag_of(field)} {what}")
    for other in REGISTRY.values():
        for field in other.owns:
            if field not in impl.owns and given(spec, field):
                users = [i.name for i in REGISTRY.values() if field in i.owns]
                raise UserError(f"{flag_of(field)} is used by --impl {' or --impl '.join(users)}; "
                                f"add {'one of them' if len(users) > 1 else f'--impl {users[0]}'}")
    for field, why in impl.refuses:
        if given(spec, field):
            raise UserError(f"{flag_of(field)} {said(impl, why)}")
    return impl


def offered(impl: Implementation) -> list[str]:
    """The schedules `impl` can run, in registry order: those every one of its runner classes
    declares what they need (`schedules.runnable`); the reference always."""
    from ..util.defaults import REFERENCE
    from ..measure.schedules import compare_schedules, runnable

    classes = impl.runner_classes()
    return [s for s in compare_schedules() if s == REFERENCE or all(runnable(c, s) for c in classes)]


def why_not(impl: Implementation, names) -> str:
    """What its runners lack for each of `names`: "it needs: expand", "rollback: it can neither ..."."""
    from ..measure.schedules import missing

    whys = [next(w for w in (missing(c, s) for c in impl.runner_classes()) if w) for s in names]
    return whys[0] if len(whys) == 1 else "; ".join(f"{s}: {w}" for s, w in zip(names, whys))


def schedules_for(spec, impl: Implementation, allow_reference: bool = False) -> list[str]:
    """--schedules for `impl`: one its runners cannot run is refused when listed by name and left
    out of the default list."""
    from ..util.defaults import DEFAULT_SCHEDULES, ENGINE_SCHEDULES

    can = offered(impl)  # first: importing its runners registers the schedules they bring
    listed = spec.schedule_list(allow_reference=allow_reference)
    default = spec.schedules == ",".join(DEFAULT_SCHEDULES)
    cannot = [s for s in listed if s not in can]
    if cannot and not default:
        raise UserError(f"--schedules: {', '.join(cannot)} cannot run with --impl {impl.name} "
                        f"({why_not(impl, cannot)}); choose from {', '.join(s for s in can if s != 'full')}")
    if default:  # the default: every schedule it can run, those only engines run (prefix) included
        listed = [s for s in can if s in listed or (s in ENGINE_SCHEDULES and s in can)]
    return [s for s in listed if s in can]
