"""The miner's routes (backends/bittensor/protocol.py) over one home.

Every request is read whole but bounded (protocol.MAX_JSON_BYTES, else 413), checked with btauth for this
miner's hotkey with a nonce store in the home (auth.py: a replay is refused after a restart too), then
against whom it serves (miner/callers.py: its allowlist and minimum stake, 403; 503 when the stake cannot be
read now); a bundle upload is checked over an empty body, before one byte of it is read. Only the broker
that dispatched an attempt may read or act on it, and each attempt runs on the terms of its quote
(miner/terms.py: one dispatch per quote, at most its hours). Refusals are {"error": reason}, never echoing
what was signed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ValidationError

from trainmaster.backends.base import Handle
from trainmaster.backends.bittensor import auth, protocol
from trainmaster.backends.bittensor.miner import callers, files, pricing, runner, terms
from trainmaster.backends.bittensor.miner.config import MinerConfig
from trainmaster.backends.bittensor.miner.files import refusal
from trainmaster.backends.bittensor.miner.store import Attempt, AttemptStore
from trainmaster.backends.features import Acknowledgement, Conclusion, SignedCommitment
from trainmaster.jobs.commitment import MAX_BYTES, Commitment, CommitmentError
from trainmaster.jobs.files import HostileFile, read_regular, tree_bytes
from trainmaster.jobs.signing import sign, sign_commitment
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.keys import signed_by

log = logging.getLogger(__name__)
BUNDLE_ROUTE = "bundle"
CALLER = web.RequestKey("caller", str)
"""The hotkey that signed the request (checked by the middleware before any route runs)."""
BODY = web.RequestKey("body", bytes)
"""The request's raw body, read once (bounded) by the middleware."""
METRICS_LIMIT = 1 << 16


class Miner:
    """One miner: its hotkey (a Keypair: signs quotes, commitments and countersignatures), home and settings.
    `subtensor`: the SDK's class its stake rule reads the chain with (tests: a fake)."""

    def __init__(self, home: Path, hotkey, config: MinerConfig, *, wallet_dir: Path | None = None, subtensor=None):
        self.home, self.hotkey, self.config = home, hotkey, config
        self.ss58 = hotkey.ss58_address
        for sub in ("bundles", "jobs"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        self.nonces = auth.SqliteNonces(home / "nonces.db")
        self.store = AttemptStore(home / "miner.db")
        self.callers = callers.Callers(config, subtensor=subtensor)
        hide = [home] + ([wallet_dir] if wallet_dir is not None else [])
        self.local = runner.local_backend(config.local, confine=config.confine, hide=hide)
        self._lock = asyncio.Lock()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=protocol.MAX_JSON_BYTES, middlewares=[self._checked])
        p, add = protocol, app.router
        add.add_get(p.HELLO, self.hello)
        add.add_post(p.QUOTE, self.quote)
        add.add_put(p.BUNDLE, self.bundle, name=BUNDLE_ROUTE)
        add.add_post(p.ATTEMPTS, self.dispatch)
        add.add_get(p.STATUS, self.status)
        add.add_get(p.LOGS, self.logs)
        add.add_get(p.METRICS, self.metrics)
        add.add_get(p.COMMITMENT, self.commitment)
        add.add_post(p.CHALLENGE, self.challenge)
        add.add_get(p.CHALLENGED_FILE, self.challenged_file)
        add.add_post(p.LEAVES, self.leaves)
        add.add_get(p.OUTPUTS, self.outputs)
        add.add_get(p.OUTPUT_FILE, self.output_file)
        add.add_post(p.CANCEL, self.cancel)
        add.add_post(p.CONCLUDE, self.conclude)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app) -> None:
        self.nonces.close()
        self.store.close()

    @web.middleware
    async def _checked(self, request: web.Request, handler):
        """The body (bounded), the signature, whom it serves; then the route. Unexpected errors are a 500."""
        if request.match_info.route.name == BUNDLE_ROUTE:
            body = b""  # signed over an empty body: the path's sha256 binds the stream (auth.py)
        else:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _error(413, f"the body is over {protocol.MAX_JSON_BYTES} bytes")
        try:
            caller = auth.check(request.headers, body, method=request.method, path=request.path_qs,
                                miner_hotkey=self.ss58, nonces=self.nonces)
        except auth.AuthRefused as refused:
            return _error(refused.status, refused.reason)
        try:
            await self.callers.check(caller)
        except callers.Refused as refused:
            return _error(refused.status, refused.reason)
        request[CALLER], request[BODY] = caller, body
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, "internal error")

    # before an attempt

    async def hello(self, request: web.Request) -> web.Response:
        return _model(protocol.Hello(protocol=protocol.VERSION, hotkey=self.ss58))

    async def quote(self, request: web.Request) -> web.Response:
        asked = _parse(protocol.QuoteRequest, request[BODY])
        spec = _parse_spec(asked.spec)
        offer = await self._offer(spec)
        try:
            quote = pricing.make_quote(asked.spec, spec, offer, self.config, miner=self.ss58,
                                       broker=request[CALLER], total_steps=asked.total_steps)
        except pricing.Unpriced as exc:
            raise refusal(web.HTTPUnprocessableEntity, str(exc)) from None
        return _model(pricing.signed(quote, self.hotkey))

    async def bundle(self, request: web.Request) -> web.Response:
        sha256 = request.match_info["sha256"]
        if not protocol.HEX64.fullmatch(sha256):
            raise refusal(web.HTTPNotFound, "a bundle is named by its sha256 (64 lowercase hex digits)")
        target = runner.bundle_path(self.home, sha256)
        if target.is_file():
            return web.json_response({"sha256": sha256, "size": target.stat().st_size})
        limit = self.config.max_bundle_bytes
        if (request.content_length or 0) > limit:
            raise refusal(files.BodyTooLarge, f"bundles are at most {self.config.max_bundle_mb} MiB here")
        await self._disk_left(request.content_length or 0)
        try:
            size = await files.receive_bundle(request, target, sha256, limit)
        except files.TooLarge:
            raise refusal(files.BodyTooLarge, f"bundles are at most {self.config.max_bundle_mb} MiB here") from None
        except files.Mismatch as got:
            raise refusal(web.HTTPUnprocessableEntity, f"the body's sha256 is {got}, not the one named") from None
        return web.json_response({"sha256": sha256, "size": size})

    async def dispatch(self, request: web.Request) -> web.Response:
        body, caller = request[BODY], request[CALLER]
        dispatch = _parse(protocol.Dispatch, body)
        body_sha256 = hashlib.sha256(body).hexdigest()
        async with self._lock:
            known = self.store.get(dispatch.attempt_id)
            if known is not None:
                return _resent(known, caller, body_sha256)
            quote = self._check_quote(dispatch, caller)
            if self.store.on_quote(quote.quote_id) is not None:
                raise refusal(web.HTTPConflict, protocol.QUOTE_USED)
            spec = _parse_spec(dispatch.spec)
            if not runner.bundle_path(self.home, dispatch.bundle_sha256).is_file():
                raise refusal(web.HTTPConflict, "the bundle was not uploaded")
            offer = await self._offer(spec)
            if len(await self._running()) >= self.config.max_concurrent_jobs:
                raise refusal(web.HTTPServiceUnavailable,
                              f"busy: {self.config.max_concurrent_jobs} attempt(s) run here at once")
            await self._disk_left(0)
            accepted = protocol.Accepted(attempt_id=dispatch.attempt_id, hotkey=self.ss58, accepted_at=time.time())
            handle = await runner.start(self.local, self.home, dispatch, terms.held_to(spec, quote), offer)
            self.store.add(Attempt(
                attempt_id=dispatch.attempt_id, caller=caller, body_sha256=body_sha256,
                quote_json=dispatch.quote.quote, challenge_digest=dispatch.challenge_digest,
                handle_json=handle.model_dump_json(), accepted_json=accepted.model_dump_json(),
                created_at=accepted.accepted_at, concluded_at=None, told_json=None, countersignature=None))
        return _model(accepted)

    def _check_quote(self, dispatch: protocol.Dispatch, caller: str) -> protocol.Quote:
        """The quote, when it is this miner's own signature, made for this caller, unexpired, for this very spec."""
        signed = dispatch.quote
        if not signed_by(signed.quote.encode(), signed.signature, self.ss58):
            raise refusal(web.HTTPUnprocessableEntity, "the quote is not signed by this miner")
        try:
            quote = signed.parsed()
        except ValueError:
            raise refusal(web.HTTPUnprocessableEntity, "the quote is not a quote in canonical JSON") from None
        problem = (
            "the quote is another miner's" if quote.miner != self.ss58 else
            "the quote was made for another broker" if quote.broker != caller else
            "the quote has expired" if time.time() > quote.valid_until else
            "the spec is not the one quoted" if protocol.spec_sha256(dispatch.spec) != quote.spec_sha256 else None)
        if problem:
            raise refusal(web.HTTPUnprocessableEntity, problem)
        return quote

    async def _offer(self, spec: JobSpec):
        offer, reasons = await runner.offer_for(self.local, spec)
        if offer is None:
            raise refusal(web.HTTPUnprocessableEntity, "this miner cannot run the job: " + "; ".join(reasons))
        return offer

    async def _running(self) -> list[Attempt]:
        """Attempts whose run has not ended."""
        running = []
        for attempt in self.store.unconcluded():
            if not (await self.local.status(_handle(attempt))).phase.done:
                running.append(attempt)
        return running

    async def _disk_left(self, incoming: int) -> None:
        limit = self.config.max_disk_bytes
        if limit is None:
            return
        used = sum([await asyncio.to_thread(tree_bytes, self.home / sub) for sub in ("bundles", "jobs")])
        if used + incoming > limit:
            raise refusal(web.HTTPServiceUnavailable, f"disk full: this miner keeps at most {self.config.max_disk_gb} GiB")

    # one attempt

    def _attempt(self, request: web.Request) -> Attempt:
        attempt_id = request.match_info["attempt_id"]
        attempt = self.store.get(attempt_id) if protocol.ATTEMPT_ID.fullmatch(attempt_id) else None
        if attempt is None:
            raise refusal(web.HTTPNotFound, "no such attempt here")
        if attempt.caller != request[CALLER]:
            raise refusal(web.HTTPForbidden, "the attempt was dispatched by another broker")
        return attempt

    async def status(self, request: web.Request) -> web.Response:
        attempt = self._attempt(request)
        return _model(terms.told(await self.local.status(_handle(attempt)), _quote(attempt)))

    async def logs(self, request: web.Request) -> web.Response:
        return _model(await self.local.logs(_handle(self._attempt(request)), _int(request, "offset")))

    async def metrics(self, request: web.Request) -> web.Response:
        import base64

        limit = min(_int(request, "limit", METRICS_LIMIT), METRICS_LIMIT)
        chunk = await self.local.metrics(_handle(self._attempt(request)), _int(request, "offset"), limit)
        return _model(protocol.Metrics(data=base64.b64encode(chunk.data).decode(), offset=chunk.offset,
                                       size=chunk.size, modified_at=chunk.modified_at))

    async def commitment(self, request: web.Request) -> web.Response:
        attempt = self._attempt(request)
        commitment, data = await self._committed(attempt)
        return _model(SignedCommitment(commitment=data.decode(), signature=sign_commitment(commitment, self.hotkey)))

    async def _committed(self, attempt: Attempt) -> tuple[Commitment, bytes]:
        """The run's commitment and its exact bytes, once the run has ended with one (409 before)."""
        handle = _handle(attempt)
        if not (await self.local.status(handle)).phase.done:
            raise refusal(web.HTTPConflict, "the run has not ended")
        path = Path(handle.data["workdir"]) / "outputs" / "commitment.json"
        try:
            data = await asyncio.to_thread(read_regular, path, MAX_BYTES)
            return Commitment.from_json(data), data
        except (OSError, HostileFile):
            raise refusal(web.HTTPConflict, "the run committed nothing") from None
        except CommitmentError:
            raise refusal(web.HTTPConflict, "the run's commitment.json is not a valid commitment") from None

    async def challenge(self, request: web.Request) -> web.Response:
        attempt = self._attempt(request)
        asked = _parse(protocol.Challenge, request[BODY])
        if attempt.concluded_at is not None:
            raise refusal(web.HTTPConflict, "the attempt is concluded; its segments are removed")
        await self._committed(attempt)
        if min(asked.indices) < 0:
            raise refusal(web.HTTPUnprocessableEntity, "segment indices are not negative")
        from trainmaster.backends.segment_reopen import ReopenFailed, open_boundaries, reopen_dropped

        checkpoints = _workdir(attempt) / "checkpoints"
        try:  # states the run did not keep are re-made first, and only if they reproduce their leaves
            await reopen_dropped(checkpoints, asked.indices)
            if asked.boundaries:  # the sampled tier: chunks of every boundary, in chunks/
                await open_boundaries(checkpoints, asked.indices, checkpoints)
        except ReopenFailed as exc:
            raise refusal(web.HTTPConflict, f"cannot open the challenged segments: {exc}") from None
        except (OSError, ValueError, RuntimeError) as exc:  # the run's checkpoints are incomplete or unreadable
            raise refusal(web.HTTPConflict, f"cannot open the boundaries: {type(exc).__name__}: {exc}") from None
        found = await asyncio.to_thread(files.challenge_manifest, _workdir(attempt), asked.indices)
        return _model(protocol.Files(files=found))

    async def leaves(self, request: web.Request) -> web.Response:
        """The refereed tier's bisection: the committed leaves asked for, each with its inclusion proof."""
        from trainmaster.backends.segments import LeavesUnreadable, leaf_openings

        attempt = self._attempt(request)
        asked = _parse(protocol.Leaves, request[BODY])
        if attempt.concluded_at is not None:
            raise refusal(web.HTTPConflict, "the attempt is concluded; its segments are removed")
        await self._committed(attempt)
        try:
            found = await asyncio.to_thread(leaf_openings, _workdir(attempt) / "checkpoints", asked.indices)
        except LeavesUnreadable as exc:
            raise refusal(web.HTTPConflict, f"cannot open the leaves: {exc}") from None
        return _model(protocol.LeafOpenings(leaves=found))

    async def challenged_file(self, request: web.Request) -> web.StreamResponse:
        root = files.real_dir(_workdir(self._attempt(request)), "checkpoints")
        return await files.send(request, root and files.regular_file(root, request.match_info["path"]))

    async def outputs(self, request: web.Request) -> web.Response:
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        return _model(protocol.Files(files=await asyncio.to_thread(files.manifest, root)))

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        return await files.send(request, root and files.regular_file(root, request.match_info["path"]))

    async def cancel(self, request: web.Request) -> web.Response:
        return _model(protocol.Cancelled(stopped=await self.local.cancel(_handle(self._attempt(request)))))

    async def conclude(self, request: web.Request) -> web.Response:
        """Check the broker's receipt and revealed secret, keep what it was told, countersign the receipt, and
        then free the attempt's segments. Told the same again, it answers the same."""
        attempt = self._attempt(request)
        told = _parse(Conclusion, request[BODY])
        async with self._lock:
            attempt = self.store.get(attempt.attempt_id)
            if attempt.told_json is not None:
                if Conclusion.model_validate_json(attempt.told_json) != told:
                    raise refusal(web.HTTPConflict, "the attempt was concluded with another receipt")
                return _model(Acknowledgement(countersignature=attempt.countersignature))
            if not signed_by(told.receipt.encode(), told.signature, told.broker):
                raise refusal(web.HTTPUnprocessableEntity, "the receipt is not signed by the key it names")
            if _digest(told.challenge_secret) != attempt.challenge_digest:
                raise refusal(web.HTTPUnprocessableEntity, "the secret's sha256 is not the digest published at dispatch")
            handle = _handle(attempt)
            if not (await self.local.status(handle)).phase.done:
                await self.local.cancel(handle)
            countersignature = sign(told.receipt.encode(), self.hotkey)
            self.store.conclude(attempt.attempt_id, told.model_dump_json(), countersignature)
        await self.local.release_segments(handle, set())
        return _model(Acknowledgement(countersignature=countersignature))


def _resent(known: Attempt, caller: str, body_sha256: str) -> web.Response:
    """The answer to a dispatch of an attempt id already taken: the same answer for the same body."""
    if known.caller != caller:
        raise refusal(web.HTTPForbidden, "the attempt was dispatched by another broker")
    if known.body_sha256 != body_sha256:
        raise refusal(web.HTTPConflict, "the attempt was dispatched before with another body")
    return web.Response(text=known.accepted_json, content_type="application/json")


def _handle(attempt: Attempt) -> Handle:
    return Handle.model_validate_json(attempt.handle_json)


def _quote(attempt: Attempt) -> protocol.Quote:
    return protocol.Quote.model_validate_json(attempt.quote_json)


def _workdir(attempt: Attempt) -> Path:
    return Path(_handle(attempt).data["workdir"])


def _digest(secret_hex: str) -> str | None:
    try:
        return hashlib.sha256(bytes.fromhex(secret_hex)).hexdigest()
    except ValueError:
        return None


def _parse(model: type[BaseModel], body: bytes):
    """`body` as `model`; 422 naming the fields that are wrong (never their values)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise refusal(web.HTTPUnprocessableEntity, _problems(exc)) from None


def _parse_spec(spec: dict) -> JobSpec:
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        raise refusal(web.HTTPUnprocessableEntity, "not a valid job spec: " + _problems(exc)) from None


def _problems(exc: ValidationError) -> str:
    found = exc.errors(include_input=False, include_url=False, include_context=False)
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the body'}: {e['msg']}" for e in found[:5])


def _int(request: web.Request, name: str, default: int = 0) -> int:
    text = request.query.get(name, str(default))
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise refusal(web.HTTPUnprocessableEntity, f"{name} is not a non-negative integer")
    return int(text)


def _model(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)
