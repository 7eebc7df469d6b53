"""One module per CLI command: each parses options, calls the library, renders."""
