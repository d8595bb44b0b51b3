import sys

from swarmrl.cli import main

sys.exit(main())
