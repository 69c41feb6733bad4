"""``python -m rollcall``: same as the ``rollcall`` console script."""

from rollcall.cli import main

raise SystemExit(main())
