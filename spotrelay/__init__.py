"""spotrelay: run GPU jobs on EC2 Spot at the lowest cost that still finishes them."""

__version__ = "0.1.0"
