import sys

from ctu.app.cli import main

sys.exit(main())
