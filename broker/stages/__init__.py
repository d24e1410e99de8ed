"""The stages of a job's life, one module each, as functions over the broker's parts (job_context.py):

submission (check, plan, bundle, record) → offer_rounds (gather offers, choose; again after a failed attempt or an
expired quote) → dispatch (cost cap, budgets, the machine's claim, the reservation, the attempt started) → watch
(status, the cost cap while it runs) → collect (fetch, keep, verification.py, share, promote, give disk back) →
ledger_moves (cost recorded, charged or released, the executor paid and concluded). reactions gives every failure
its one reaction; cancelling and resuming are the user's actions; advancing drives a job from whatever state is
recorded; log_following streams its log. broker/service.py is the façade the CLI, the daemon and the tests call.
"""
