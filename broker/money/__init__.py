"""Money around a job: the cost cap, budgets that wait, the price agreed with an untrusted executor, and
settling with it (its payment sent and its conclusion delivered, exactly once)."""
