"""Rendering results for people: the console table (`table`) and the figures (`figures`)."""
