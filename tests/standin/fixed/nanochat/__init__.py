"""Test double for a nanochat checkout, written for smearcli's tests (not upstream code)."""
