import sys

from draftgate.cli import main

sys.exit(main())
