"""The subcommands: compare, plot, bench."""
