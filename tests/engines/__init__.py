"""Engines that exist for the tests: each one folder and one registration, as a real engine is."""
