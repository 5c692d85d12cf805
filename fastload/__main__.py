"""`python -m fastload ...` is the `fastload` command."""
from .cli import main

raise SystemExit(main())
