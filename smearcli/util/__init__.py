"""Utilities every layer uses, torch-free: names and defaults (`defaults`), number formatters,
`UserError` (`errors`), whole-file writes (`files`), strict JSON (`jsonsafe`), which frame of someone
else's code raised (`frames`), objects named by "module:name" (`named`), CPU threads and freed
memory (`threads`, `allocator`), and what this machine cannot run (`preflight`)."""
