"""`python -m trainmaster.broker.daemon`: run the daemon in this process (what `trainmaster daemon start` detaches)."""

import sys

from trainmaster.broker.daemon.process import main

sys.exit(main())
