"""The scheduler daemon: a reconciler that advances jobs under leases in the database, an authenticated
HTTP API with the CLI's operations, and the process that runs both (`trainmaster daemon start|stop|status`).

Only the `daemon` commands and the commands that talk to a running daemon import this package's
server side (aiohttp); the CLI without a daemon uses `reconciler` alone.
"""
