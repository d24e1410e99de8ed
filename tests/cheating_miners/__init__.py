"""Cheating miners for the tests: the reference miner (`trainmaster miner serve`) started as a process of its
own with one behaviour changed, run as

    python -m cheating_miners KIND <miner serve options>

KIND is one of KINDS. Three run the job's training for real but altered (train.py is put in place of the
job's entrypoint): `skip_half` trains the first half of the segments and commits the rest as copies of the
last state, `freeze` inflates Adam's second moments at a segment boundary so training stalls from there,
`reuse` answers every job after its first with that first job's run. The others change one route of the
miner (miners.py): `wrong_key` signs its commitment with another hotkey, `replay` sends the broker's signed
dispatch again (to itself and to the miner named by CHEATING_REPLAY_TO), `silent` never answers a challenge,
`vanish` is gone (killed) once its run has committed, `cut` drops the connection halfway through each
output's first download, `bad_hash` serves outputs whose bytes differ from the sha256 it announced, `huge` announces
its model as 10 TB, `trickle` serves its outputs a byte a second, `short` serves every output 100 bytes short in a
well-formed answer, `short_range` answers a resume with less than its Content-Range, `mute` never answers again after
the dispatch, `overrun` says it runs forever, `escapes` paints terminal escapes into its log and claims to have
started 100 hours ago.
For the refereed tier, `nudge` trains honestly but pushes its weights at one boundary by a step far inside any
tolerance (within-τ poisoning, invisible to sampling), and `nudge_silent` / `nudge_garbage` do that and then,
asked for leaves in a bisection, never answer / answer bytes that are not JSON. `w0` starts its run from a W0 of
its own choosing (another seed's model) and trains honestly from there.
process.py starts one from a test.
"""

KINDS = ("skip_half", "freeze", "reuse", "wrong_key", "replay", "silent", "vanish", "cut", "bad_hash", "huge", "trickle",
         "short", "short_range", "mute", "overrun", "escapes", "nudge", "nudge_silent", "nudge_garbage", "w0")
TRAINING = ("skip_half", "freeze", "reuse", "nudge", "nudge_silent", "nudge_garbage", "w0")
"""Kinds that alter the job's training (train.py); a kind may also change a route (miners.py CHEATS)."""
