"""`python -m envs base|task ...`: build Docker images (see envs.images)."""

import sys

from envs.images import main

sys.exit(main())
