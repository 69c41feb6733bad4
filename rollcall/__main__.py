"""``python -m rollcall``: same as the ``rollcall`` console script."""

from rollcall.app.cli import main

raise SystemExit(main())
