"""`python -m envs base|task ...`: build Docker images (see envs.provision.images)."""

import sys

from envs.provision.images import main

sys.exit(main())
