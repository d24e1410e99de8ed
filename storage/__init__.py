"""Persistence shared by the broker's store, the ledger, the executor records and the verdict records:
the SQLite plumbing of `state.db`. It imports nothing else of ours, and it is never imported inside a
training process (it is kept out of `jobs`, the package that runs there)."""
