from confparse.config import Config
from confparse.parser import ConfigError

__all__ = ["Config", "ConfigError"]
