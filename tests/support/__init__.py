"""Helpers the tests share (imported as ``support.<module>``)."""
