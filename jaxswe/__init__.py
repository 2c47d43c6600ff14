"""jaxswe: RFT and DAPO RL for long-context multi-turn SWE agents, in JAX/Flax."""

__version__ = "0.1.0"
