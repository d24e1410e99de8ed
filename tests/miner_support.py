"""A real reference miner for tests: `trainmaster miner serve` as a process of its own on a free port of
127.0.0.1, with its own home and a wallet made without a password in a temp dir; killed the way a machine
dies (`kill -9` of the server and every process it started, its jobs' supervisors included) and started
again on the same home and port. `MinerClient` signs raw protocol calls with a test broker's hotkey.

    wallets = tmp_path / "wallets"
    miner = MinerProcess(tmp_path / "miner", make_wallet(wallets, "miner"), config={...}).start()
    client = MinerClient(miner, make_wallet(wallets, "broker"))
    client.call("GET", protocol.HELLO).json()
    miner.kill9(); miner.restart()
"""

from __future__ import annotations

import http.client
import json as jsonlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from process_tree import kill_tree
from trainmaster.backends.bittensor import auth, protocol

START_S = 180.0  # a bound only: it starts in ~2 s; CI's runner once stalled every process for 1-2 min


def make_wallet(path: Path, name: str):
    """A bittensor Wallet `name` under `path` (coldkey and hotkey `default`), no password: tests only."""
    from bittensor.wallet import Wallet

    return (Wallet(name, "default", path=str(path))
            .create_new_coldkey(use_password=False, overwrite=True, suppress=True)
            .create_new_hotkey(use_password=False, overwrite=True, suppress=True))


class MinerProcess:
    """`trainmaster miner serve` for `wallet` on its own home; `config` (a dict) is written as its miner.yaml."""

    def __init__(self, home: Path, wallet, *, config: dict | None = None, port: int | None = None):
        self.home, self.wallet = Path(home), wallet
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.home.mkdir(parents=True, exist_ok=True)
        if config is not None:
            (self.home / "miner.yaml").write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hotkey(self) -> str:
        return self.wallet.hotkey.ss58_address

    def command(self) -> list[str]:
        return [sys.executable, "-m", "trainmaster.broker.cli", "miner", "serve", "--wallet", self.wallet.name,
                "--wallet-path", str(self.wallet.path), "--port", str(self.port), "--home", str(self.home)]

    def start(self, probe=None) -> MinerProcess:
        """Start the server and wait until a signed `hello` (by `probe`, a wallet; the miner's own by
        default) answers with this protocol's version and the miner's hotkey."""
        env = {**os.environ, "TRAINMASTER_HOME": str(self.home)}
        with open(self.home / "server.log", "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=env, cwd=self.home, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        client = MinerClient(self, probe or self.wallet)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the miner exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                hello = client.call("GET", protocol.HELLO)
            except OSError:
                time.sleep(0.05)
                continue
            assert hello.status == 200, hello.body
            assert hello.json() == {"protocol": protocol.VERSION, "hotkey": self.hotkey}
            return self
        raise RuntimeError(f"the miner did not answer within {START_S:.0f} s: {self.log_tail()}")

    def kill9(self) -> int:
        """SIGKILL to the server and every process it started; returns how many there were."""
        return kill_tree(self.proc)

    def restart(self) -> MinerProcess:
        """Start again on the same home and port (after kill9 or stop)."""
        return self.start()

    def stop(self) -> None:
        """Stop what is left of the miner (after a test)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()

    def log_tail(self) -> str:
        log = self.home / "server.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else ""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return jsonlib.loads(self.body)


class MinerClient:
    """Signed calls to one miner as the broker whose wallet (or Keypair) is `signer`."""

    def __init__(self, miner: MinerProcess, signer, *, receiver: str | None = None):
        self.miner, self.signer = miner, signer
        self.receiver = receiver or miner.hotkey

    def headers(self, method: str, path: str, body: bytes = b"") -> dict[str, str]:
        """btauth headers for one request (a bundle upload is signed over an empty body)."""
        return auth.sign(self.signer, method=method, path=path, body=body, receiver=self.receiver)

    def call(self, method: str, path: str, json=None, data: bytes | None = None,
             headers: dict[str, str] | None = None) -> Response:
        """Sign and send one request: `json` (a dict or pydantic model) or raw `data` as the body."""
        body = _body(json, data)
        signed_over = b"" if path.startswith(protocol.PREFIX + "/bundles/") else body
        return self.send(method, path, body, {**self.headers(method, path, signed_over), **(headers or {})})

    def send(self, method: str, path: str, body=b"", headers: dict[str, str] | None = None) -> Response:
        """Send exactly these bytes (or these chunks, an iterator: sent chunked, no length announced) and
        headers (to replay a request, or send one unsigned)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.miner.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            answer = conn.getresponse()
            return Response(answer.status, dict(answer.getheaders()), answer.read())
        finally:
            conn.close()


def _body(json, data: bytes | None) -> bytes:
    if data is not None:
        return data
    if json is None:
        return b""
    if hasattr(json, "model_dump_json"):
        return json.model_dump_json().encode()
    return jsonlib.dumps(json).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tm(*args: str) -> subprocess.CompletedProcess:
    """`trainmaster ARGS` in a process of its own, as a user runs it (this test's environment)."""
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ), timeout=280)


def shown(done: subprocess.CompletedProcess) -> dict:
    """The JSON object a `--json` command printed."""
    assert "{" in done.stdout, done.stdout + done.stderr
    return jsonlib.loads(done.stdout[done.stdout.index("{"):])
