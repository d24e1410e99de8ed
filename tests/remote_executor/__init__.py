"""The remote harness: an executor run as a separate process (its own TRAINMASTER_HOME, an HTTP server on
127.0.0.1) and the client backend the broker uses to reach it. The two share nothing but the protocol
(protocol.py, a small versioned JSON API the Bittensor backend and a reference miner can grow from):
the broker never receives a path of the executor's, and the executor never sees the broker's home.

- server.py: `python -m remote_executor.server --home H --port P`, a real LocalBackend in H behind the
  untrusted behaviour of tests/untrusted_backend.py (TAO quotes, sr25519-signed commitments);
- client.py: `RemoteExecutor`, a Backend speaking only HTTP to it (untrusted, registered as `bittensor`),
  and `TrustedRemoteExecutor`, the same client registered as a trusted backend;
- process.py: starting, killing (`kill -9` of the whole executor) and restarting the server process.
"""
