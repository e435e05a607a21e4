"""``python -m agentbolt_verl train CONFIG``."""

from __future__ import annotations

import sys

from .binding.entrypoint import main

if __name__ == "__main__":
    sys.exit(main())
