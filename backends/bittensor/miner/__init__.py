"""The reference miner (`trainmaster miner serve`): the miner protocol (backends/bittensor/protocol.py)
served over aiohttp, each attempt run by the project's local backend in the miner's own home.

config.py its settings (miner.yaml), store.py its attempts in SQLite, pricing.py quotes, runner.py the
one place the local backend is built, files.py file routes (manifests, Range downloads), app.py the
routes, serve.py start-up (the wallet's hotkey, the home, the port)."""
