"""`python -m trainmaster.broker.daemon`: run the daemon in this process (what `trainmaster daemon start` detaches)."""

from trainmaster.broker.daemon.process import main

main()
