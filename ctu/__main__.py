import sys

from ctu.cli import main

sys.exit(main())
