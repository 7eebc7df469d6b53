"""The command line: the only layer that knows flag names and exit codes. Each command parses
options (`options`), turns them into a run (`build`), calls the library and renders."""
