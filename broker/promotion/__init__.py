"""Promotion of accepted checkpoints: their lineage recorded in the broker's database, and, when
`registry.yaml` configures one, each registered as a version in an MLflow model registry whose
`production` alias moves only when the promotion gate passes (docs/promotion.md).

`hook.on_accepted(store, job_id)` is what the broker calls once a job is accepted; `hook.retry_pending(store)`
what its reconcile pass calls for promotions a registry that was down left pending."""
