import sys

from . import MISSING_EXTRA

if MISSING_EXTRA is not None:  # the serve extra is not installed: say what to install, no traceback
    print(f"error: {MISSING_EXTRA}", file=sys.stderr)
    raise SystemExit(2)

from .cli import main  # after the check above: it imports fastapi and uvicorn

raise SystemExit(main())
