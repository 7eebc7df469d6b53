"""A user's nanochat checkout: imported in isolation (`sandbox`), driven through our interface
(`adapter`), audited (`audit`)."""
