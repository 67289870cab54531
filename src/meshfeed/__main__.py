import sys

from meshfeed._cli import main

sys.exit(main())
