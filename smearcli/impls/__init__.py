"""Implementations smearcli runs and checks besides its own GPT."""
