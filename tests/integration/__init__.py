"""Adapter tests against moto (`spotrelay.aws`)."""
