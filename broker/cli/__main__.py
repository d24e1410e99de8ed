"""`python -m trainmaster.broker.cli`, the same as the `trainmaster` script."""

from trainmaster.broker.cli import main

main()
