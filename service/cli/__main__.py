"""`python -m service.cli ...` — how `tandem pi` and the benchmarks start a server (same as `tandem`)."""

import sys

from service.cli.main import main

__all__: list[str] = []

sys.exit(main())
