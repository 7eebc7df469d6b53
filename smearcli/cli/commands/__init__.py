"""The subcommands: compare, plot, bench, fix and scan. Each parses its options, asks the library
(and, for `--impl`, the registry in `engines.registry`) for the work, and renders what comes back."""
