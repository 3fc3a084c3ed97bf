"""lit_rlvr: RL with verifiable rewards that preserves diversity, the Lightning way."""

__version__ = "0.1.0"
